! The stream extension for Fortran: `use streamcoll` (with `use mpi`, `include 'mpif.h'` or
! `use mpi_f08`) and attach a CUDA stream to a communicator; collectives on GPU buffers
! on it are then ordered on that stream and return without waiting for it (the C API:
! streamcoll/streamext.h). The stream is an integer(kind=streamcoll_stream_kind), that is
! c_intptr_t, the kind of CUDA Fortran's integer(kind=cuda_stream_kind) and of OpenACC's
! acc_get_cuda_stream(queue), so that either passes straight in:
!
!   use streamcoll
!   call streamcoll_comm_attach_stream(comm, acc_get_cuda_stream(acc_async_sync), ierr)
!
! Each procedure takes an INTEGER communicator (mpif.h, use mpi) or, where the module was
! built with the MPI's mpi_f08, a TYPE(MPI_Comm); ierr is optional. Errors: MPI_SUCCESS,
! STREAMCOLL_ERR_ABSENT (streamcoll not in this process, disabled, or MPI not
! initialised: nothing attached, synchronise yourself), or the MPI error code of the
! attribute call (MPI_ERR_COMM for MPI_COMM_NULL). Local calls (not collective); each
! thread its own communicators, as for MPI_Comm_set_attr.
module streamcoll
  use iso_c_binding, only: c_int, c_intptr_t
#ifdef STREAMCOLL_F08
  use mpi_f08, only: MPI_Comm
#endif
  implicit none
  private

  !> The kind of a CUDA stream handle (cuda_stream_kind, acc_handle_kind).
  integer, parameter, public :: streamcoll_stream_kind = c_intptr_t
  !> Returned when streamcoll is not in this process (not an MPI error code).
  integer, parameter, public :: STREAMCOLL_ERR_ABSENT = -1

  public :: streamcoll_stream_available, streamcoll_comm_attach_stream, &
            streamcoll_comm_get_stream, streamcoll_comm_detach_stream

  !> Attaches `stream` to `comm`, replacing any stream attached before.
  interface streamcoll_comm_attach_stream
    module procedure attach_int
#ifdef STREAMCOLL_F08
    module procedure attach_f08
#endif
  end interface
  !> The stream attached to `comm`: flag .true. and stream set, or flag .false.
  interface streamcoll_comm_get_stream
    module procedure get_int
#ifdef STREAMCOLL_F08
    module procedure get_f08
#endif
  end interface
  !> Detaches the stream from `comm` (none attached: not an error); later collectives on
  !> it have classic semantics.
  interface streamcoll_comm_detach_stream
    module procedure detach_int
#ifdef STREAMCOLL_F08
    module procedure detach_f08
#endif
  end interface

  interface
    integer(c_int) function c_available() bind(C, name="streamcoll_f_stream_available")
      import :: c_int
    end function
    subroutine c_attach(comm, stream, ierr) bind(C, name="streamcoll_f_attach_stream")
      import :: c_int, c_intptr_t
      integer(c_int), intent(in) :: comm
      integer(c_intptr_t), value :: stream
      integer(c_int), intent(out) :: ierr
    end subroutine
    subroutine c_get(comm, stream, flag, ierr) bind(C, name="streamcoll_f_get_stream")
      import :: c_int, c_intptr_t
      integer(c_int), intent(in) :: comm
      integer(c_intptr_t), intent(inout) :: stream
      integer(c_int), intent(out) :: flag, ierr
    end subroutine
    subroutine c_detach(comm, ierr) bind(C, name="streamcoll_f_detach_stream")
      import :: c_int
      integer(c_int), intent(in) :: comm
      integer(c_int), intent(out) :: ierr
    end subroutine
  end interface

contains

  !> .true. if streamcoll is loaded and active: an attached stream takes effect.
  logical function streamcoll_stream_available()
    streamcoll_stream_available = c_available() /= 0
  end function

  subroutine attach_int(comm, stream, ierr)
    integer, intent(in) :: comm
    integer(c_intptr_t), intent(in) :: stream
    integer, intent(out), optional :: ierr
    integer(c_int) :: rc
    call c_attach(int(comm, c_int), stream, rc)
    if (present(ierr)) ierr = rc
  end subroutine

  subroutine get_int(comm, stream, flag, ierr)
    integer, intent(in) :: comm
    integer(c_intptr_t), intent(inout) :: stream
    logical, intent(out) :: flag
    integer, intent(out), optional :: ierr
    integer(c_int) :: rc, f
    call c_get(int(comm, c_int), stream, f, rc)
    flag = f /= 0
    if (present(ierr)) ierr = rc
  end subroutine

  subroutine detach_int(comm, ierr)
    integer, intent(in) :: comm
    integer, intent(out), optional :: ierr
    integer(c_int) :: rc
    call c_detach(int(comm, c_int), rc)
    if (present(ierr)) ierr = rc
  end subroutine

#ifdef STREAMCOLL_F08
  subroutine attach_f08(comm, stream, ierr)
    type(MPI_Comm), intent(in) :: comm
    integer(c_intptr_t), intent(in) :: stream
    integer, intent(out), optional :: ierr
    call attach_int(comm%MPI_VAL, stream, ierr)
  end subroutine

  subroutine get_f08(comm, stream, flag, ierr)
    type(MPI_Comm), intent(in) :: comm
    integer(c_intptr_t), intent(inout) :: stream
    logical, intent(out) :: flag
    integer, intent(out), optional :: ierr
    call get_int(comm%MPI_VAL, stream, flag, ierr)
  end subroutine

  subroutine detach_f08(comm, ierr)
    type(MPI_Comm), intent(in) :: comm
    integer, intent(out), optional :: ierr
    call detach_int(comm%MPI_VAL, ierr)
  end subroutine
#endif

end module streamcoll
