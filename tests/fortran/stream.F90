! The Fortran stream module (`use streamcoll`, streamext/fortran/streamcoll.F90) through
! mpif.h, or `use mpi_f08` when built with -DSTREAMCOLL_F08: a stream value attached to a
! communicator is what the C API reads back (stream_helper.c), follows MPI_Comm_dup, is
! replaced by a second attach, and is gone after detach; a collective on host memory with
! a stream attached is exact. The value stands for a stream: no GPU buffer is used, so
! nothing is enqueued on it. Without streamcoll (STREAMCOLL_EXPECT_INTERCEPT unset, the
! `plain` run) every call must answer STREAMCOLL_ERR_ABSENT. Rank 0 prints "N passed,
! N failed".
program fortran_stream
  use iso_c_binding
  use streamcoll
#ifdef STREAMCOLL_F08
  use mpi_f08
  implicit none
#define COMM type(MPI_Comm)
#else
  implicit none
  include 'mpif.h'
#define COMM integer
#endif
  interface
    subroutine sc_c_get_stream(comm, stream, flag) bind(C, name="sc_c_get_stream")
      import :: c_int, c_intptr_t
      integer(c_int), intent(in) :: comm
      integer(c_intptr_t), intent(out) :: stream
      integer(c_int), intent(out) :: flag
    end subroutine
  end interface

  integer(kind=streamcoll_stream_kind), parameter :: s1 = 4096, s2 = 8192
  integer(kind=streamcoll_stream_kind) :: got, c_got
  integer :: ierr, rank, nranks, passed, failed, totals(2), x(3), y(3)
  integer(c_int) :: c_flag
  logical :: flag, loaded
  character(len=8) :: env
  COMM :: dup

  call mpi_init(ierr)
  call mpi_comm_rank(MPI_COMM_WORLD, rank, ierr)
  call mpi_comm_size(MPI_COMM_WORLD, nranks, ierr)
  call get_environment_variable("STREAMCOLL_EXPECT_INTERCEPT", env)
  loaded = env == "1"
  passed = 0
  failed = 0
  call mpi_comm_dup(MPI_COMM_WORLD, dup, ierr)

  call check("available", streamcoll_stream_available() .eqv. loaded)
  call streamcoll_comm_attach_stream(dup, s1, ierr)
  if (.not. loaded) then
    call check("attach absent", ierr == STREAMCOLL_ERR_ABSENT)
    got = -7
    call streamcoll_comm_get_stream(dup, got, flag, ierr)
    call check("get absent", ierr == STREAMCOLL_ERR_ABSENT .and. .not. flag .and. got == -7)
    call streamcoll_comm_detach_stream(dup, ierr)
    call check("detach absent", ierr == STREAMCOLL_ERR_ABSENT)
  else
    call check("attach", ierr == MPI_SUCCESS)
    got = 0
    call streamcoll_comm_get_stream(dup, got, flag, ierr)
    call check("get", ierr == MPI_SUCCESS .and. flag .and. got == s1)
    call sc_c_get_stream(handle(dup), c_got, c_flag)
    call check("C sees it", c_flag == 1 .and. c_got == s1)
    ! no ierr: optional
    call streamcoll_comm_attach_stream(dup, s2)
    call sc_c_get_stream(handle(dup), c_got, c_flag)
    call check("attach again replaces", c_flag == 1 .and. c_got == s2)
    x = [rank, 1, 2 * rank]
    call mpi_allreduce(x, y, 3, MPI_INTEGER, MPI_SUM, dup, ierr)
    call check("host allreduce with a stream", ierr == MPI_SUCCESS .and. &
               all(y == [nranks * (nranks - 1) / 2, nranks, nranks * (nranks - 1)]))
    call dup_and_check()
    call streamcoll_comm_detach_stream(dup, ierr)
    call streamcoll_comm_get_stream(dup, got, flag, ierr)
    call check("detached", ierr == MPI_SUCCESS .and. .not. flag)
    call sc_c_get_stream(handle(dup), c_got, c_flag)
    call check("C sees it detached", c_flag == 0)
    call streamcoll_comm_detach_stream(dup, ierr)
    call check("detach twice", ierr == MPI_SUCCESS)
    call streamcoll_comm_attach_stream(MPI_COMM_WORLD, s1, ierr)
    call sc_c_get_stream(handle(MPI_COMM_WORLD), c_got, c_flag)
    call check("world", ierr == MPI_SUCCESS .and. c_flag == 1 .and. c_got == s1)
    call streamcoll_comm_detach_stream(MPI_COMM_WORLD, ierr)
  end if

  call mpi_comm_free(dup, ierr)
  call mpi_reduce([passed, failed], totals, 2, MPI_INTEGER, MPI_SUM, 0, MPI_COMM_WORLD, ierr)
  if (rank == 0) print '(i0," passed, ",i0," failed")', totals(1), totals(2)
  call mpi_finalize(ierr)
  if (failed > 0) error stop 1

contains

  integer(c_int) function handle(c)
    COMM, intent(in) :: c
#ifdef STREAMCOLL_F08
    handle = c%MPI_VAL
#else
    handle = c
#endif
  end function

  ! MPI_Comm_dup copies the stream attribute (streamcoll's copy function).
  subroutine dup_and_check()
    COMM :: d2
    integer(kind=streamcoll_stream_kind) :: g
    logical :: f
    call mpi_comm_dup(dup, d2, ierr)
    g = 0
    call streamcoll_comm_get_stream(d2, g, f, ierr)
    call check("dup keeps it", ierr == MPI_SUCCESS .and. f .and. g == s2)
    call mpi_comm_free(d2, ierr)
  end subroutine

  subroutine check(what, ok)
    character(len=*), intent(in) :: what
    logical, intent(in) :: ok
    if (ok) then
      passed = passed + 1
    else
      failed = failed + 1
      print '("rank ",i0," FAIL ",a)', rank, what
    end if
  end subroutine

end program
