! streamcoll's own requests completed through the Fortran bindings (mpif.h; `use mpi` calls
! the same symbols) of every wait/test call: MPI_WAIT, MPI_WAITALL, MPI_WAITANY,
! MPI_WAITSOME, MPI_TEST, MPI_TESTALL, MPI_TESTANY, MPI_TESTSOME, MPI_REQUEST_GET_STATUS
! and MPI_REQUEST_FREE, each on an array mixing the request with ordinary ones (a ring
! exchange). The requests are MPI_Iallreduce calls on fake device memory routed to NCCL,
! made in C (requests_helper.c) and converted with MPI_Request_c2f; they complete only
! when streamcoll polls them, so a binding that goes straight to the MPI hangs (an alarm
! fails the program after 20 s). Checked: ierr, handles set to MPI_REQUEST_NULL once
! complete (and not by MPI_REQUEST_GET_STATUS), 1-based indices, MPI_UNDEFINED once every
! request is done, LOGICAL flags, the ring receive's status (MPI_STATUS_IGNORE and
! MPI_STATUSES_IGNORE in some calls), the allreduce results and streamcoll's statistics.
! Last, an MPI_IALLREDUCE made from Fortran, routed to NCCL from the communicator's
! earlier agreement: its request reaches Fortran as a handle MPI_WAIT completes.
! Runs under the fakes (tests/fake) with streamcoll preloaded. Rank 0 prints "N passed,
! N failed".
program fortran_requests
  use, intrinsic :: iso_c_binding, only : c_ptr, c_f_pointer, c_int32_t
  implicit none
  include 'mpif.h'
  interface
    subroutine sc_req_setup(comm, ok) bind(C, name="sc_req_setup")
      integer :: comm, ok
    end subroutine
    subroutine sc_req_watch(seconds) bind(C, name="sc_req_watch")
      integer :: seconds
    end subroutine
    subroutine sc_req_start(slot, salt, req, ierr) bind(C, name="sc_req_start")
      integer :: slot, salt, req, ierr
    end subroutine
    subroutine sc_req_check(slot, ok) bind(C, name="sc_req_check")
      integer :: slot, ok
    end subroutine
    subroutine sc_req_routed(calls) bind(C, name="sc_req_routed")
      integer :: calls
    end subroutine
    subroutine sc_req_finish() bind(C, name="sc_req_finish")
    end subroutine
    subroutine sc_req_undefined_defect(defect) bind(C, name="sc_req_undefined_defect")
      integer :: defect
    end subroutine
    subroutine sc_req_buffers(slot, salt, send, recv) bind(C, name="sc_req_buffers")
      import :: c_ptr
      integer :: slot, salt
      type(c_ptr) :: send, recv
    end subroutine
  end interface

  character(len=24), parameter :: names(10) = [character(len=24) :: "mpi_wait", "mpi_waitall", &
      "mpi_waitany", "mpi_waitsome", "mpi_test", "mpi_testall", "mpi_testany", "mpi_testsome", &
      "mpi_request_get_status", "mpi_request_free"]
  integer, parameter :: ring_tag = 5
  integer :: ierr, rank, nranks, comm, ok, all_ok, passed, failed, totals(2)
  integer :: reqs(3), statuses(MPI_STATUS_SIZE, 3), status(MPI_STATUS_SIZE)
  integer :: ring_in, ring_out, prev, next, idx, outcount, indices(3), c, i, k, routed, routed0
  integer :: ring_status(MPI_STATUS_SIZE)
  logical :: flag, seen(3), have_ring_status
  character(len=40) :: what
  integer :: freq, routed_before, routed_after, defect, none_left
  type(c_ptr) :: send_ptr, recv_ptr
  integer(c_int32_t), pointer :: fsend(:), frecv(:)

  call mpi_init(ierr)
  call mpi_comm_rank(MPI_COMM_WORLD, rank, ierr)
  call mpi_comm_size(MPI_COMM_WORLD, nranks, ierr)
  passed = 0
  failed = 0
  call sc_req_setup(comm, ok)
  call mpi_allreduce(ok, all_ok, 1, MPI_INTEGER, MPI_MIN, MPI_COMM_WORLD, ierr)
  if (all_ok /= 1) then
    if (rank == 0) print '(a)', "fortran_requests: set-up failed (fakes, streamcoll, route nccl)"
    call mpi_finalize(ierr)
    error stop 1
  end if
  ! What MPI_WAITANY and MPI_TESTANY answer once every request is null: MPI_UNDEFINED, or
  ! MPICH 4.0's MPI_UNDEFINED + 1 (sc_req_undefined_defect).
  call sc_req_undefined_defect(defect)
  none_left = MPI_UNDEFINED + defect
  prev = mod(rank + nranks - 1, nranks)
  next = mod(rank + 1, nranks)

  do c = 1, 10
    what = names(c)
    call sc_req_watch(20)
    ring_in = -1
    ring_out = rank * 100 + c
    ! reqs(1): the ring receive, reqs(2): streamcoll's request, reqs(3): the ring send
    call mpi_irecv(ring_in, 1, MPI_INTEGER, prev, ring_tag, MPI_COMM_WORLD, reqs(1), ierr)
    call mpi_isend(ring_out, 1, MPI_INTEGER, next, ring_tag, MPI_COMM_WORLD, reqs(3), ierr)
    call sc_req_routed(routed0)
    call sc_req_start(0, c, reqs(2), ierr)
    call sc_req_routed(routed)
    call check("MPI_Iallreduce (C) on route nccl", ierr == MPI_SUCCESS .and. routed == routed0 + 1)
    have_ring_status = .true.
    seen = .false.
    select case (c)
    case (1)  ! mpi_wait: streamcoll's request first, the ring outstanding
      call mpi_wait(reqs(2), status, ierr)
      call check("mpi_wait", ierr == MPI_SUCCESS .and. reqs(2) == MPI_REQUEST_NULL)
      call mpi_wait(reqs(1), ring_status, ierr)
      call check("mpi_wait (receive)", ierr == MPI_SUCCESS)
      call mpi_wait(reqs(3), MPI_STATUS_IGNORE, ierr)
      call check("mpi_wait (send, MPI_STATUS_IGNORE)", ierr == MPI_SUCCESS)
    case (2)
      call mpi_waitall(3, reqs, statuses, ierr)
      call check("mpi_waitall", ierr == MPI_SUCCESS)
      ring_status = statuses(:, 1)
    case (3)
      do k = 1, 4
        call mpi_waitany(3, reqs, idx, status, ierr)
        call check("mpi_waitany", ierr == MPI_SUCCESS)
        if (idx == none_left) exit
        call check("mpi_waitany: a 1-based index, once", idx >= 1 .and. idx <= 3 .and. .not. seen(max(1, min(3, idx))))
        if (idx >= 1 .and. idx <= 3) seen(idx) = .true.
        if (idx == 1) ring_status = status
      end do
      call check("mpi_waitany: MPI_UNDEFINED once all are done", k == 4 .and. all(seen))
    case (4)
      do k = 1, 4
        call mpi_waitsome(3, reqs, outcount, indices, statuses, ierr)
        call check("mpi_waitsome", ierr == MPI_SUCCESS)
        if (outcount == MPI_UNDEFINED) exit
        call check("mpi_waitsome: some done", outcount >= 1 .and. outcount <= 3)
        do i = 1, max(0, min(3, outcount))
          idx = indices(i)
          call check("mpi_waitsome: 1-based indices, once", idx >= 1 .and. idx <= 3 .and. .not. seen(max(1, min(3, idx))))
          if (idx >= 1 .and. idx <= 3) seen(idx) = .true.
          if (idx == 1) ring_status = statuses(:, i)
        end do
      end do
      call check("mpi_waitsome: MPI_UNDEFINED once all are done", all(seen))
    case (5)  ! mpi_test loops: streamcoll's request first
      flag = .false.
      do while (.not. flag)
        call mpi_test(reqs(2), flag, status, ierr)
        if (ierr /= MPI_SUCCESS) exit
      end do
      call check("mpi_test", ierr == MPI_SUCCESS .and. flag .and. reqs(2) == MPI_REQUEST_NULL)
      flag = .false.
      do while (.not. flag .and. ierr == MPI_SUCCESS)
        call mpi_test(reqs(1), flag, ring_status, ierr)
      end do
      flag = .false.
      do while (.not. flag .and. ierr == MPI_SUCCESS)
        call mpi_test(reqs(3), flag, MPI_STATUS_IGNORE, ierr)
      end do
      call check("mpi_test (ring)", ierr == MPI_SUCCESS .and. flag)
    case (6)
      flag = .false.
      do while (.not. flag)
        call mpi_testall(3, reqs, flag, MPI_STATUSES_IGNORE, ierr)
        if (ierr /= MPI_SUCCESS) exit
      end do
      call check("mpi_testall (MPI_STATUSES_IGNORE)", ierr == MPI_SUCCESS .and. flag)
      have_ring_status = .false.
    case (7)
      do k = 1, 4
        flag = .false.
        do while (.not. flag .and. ierr == MPI_SUCCESS)
          call mpi_testany(3, reqs, idx, flag, status, ierr)
        end do
        call check("mpi_testany", ierr == MPI_SUCCESS)
        if (idx == none_left .or. ierr /= MPI_SUCCESS) exit
        call check("mpi_testany: a 1-based index, once", idx >= 1 .and. idx <= 3 .and. .not. seen(max(1, min(3, idx))))
        if (idx >= 1 .and. idx <= 3) seen(idx) = .true.
        if (idx == 1) ring_status = status
      end do
      call check("mpi_testany: MPI_UNDEFINED once all are done", k == 4 .and. all(seen))
    case (8)
      do k = 1, 8
        outcount = 0
        do while (outcount == 0 .and. ierr == MPI_SUCCESS)
          call mpi_testsome(3, reqs, outcount, indices, MPI_STATUSES_IGNORE, ierr)
        end do
        call check("mpi_testsome (MPI_STATUSES_IGNORE)", ierr == MPI_SUCCESS)
        if (outcount == MPI_UNDEFINED .or. ierr /= MPI_SUCCESS) exit
        do i = 1, max(0, min(3, outcount))
          idx = indices(i)
          call check("mpi_testsome: 1-based indices, once", idx >= 1 .and. idx <= 3 .and. .not. seen(max(1, min(3, idx))))
          if (idx >= 1 .and. idx <= 3) seen(idx) = .true.
        end do
      end do
      call check("mpi_testsome: MPI_UNDEFINED once all are done", all(seen))
      have_ring_status = .false.
    case (9)  ! polled without being freed, then mpi_wait
      flag = .false.
      do while (.not. flag)
        call mpi_request_get_status(reqs(2), flag, status, ierr)
        if (ierr /= MPI_SUCCESS) exit
      end do
      call check("mpi_request_get_status", ierr == MPI_SUCCESS .and. flag .and. reqs(2) /= MPI_REQUEST_NULL)
      call mpi_wait(reqs(2), MPI_STATUS_IGNORE, ierr)
      call check("mpi_wait after mpi_request_get_status", ierr == MPI_SUCCESS .and. reqs(2) == MPI_REQUEST_NULL)
      call mpi_waitall(3, reqs, statuses, ierr)
      ring_status = statuses(:, 1)
    case (10)  ! freed: the operation still completes (before the call returns, classic)
      call mpi_request_free(reqs(2), ierr)
      call check("mpi_request_free", ierr == MPI_SUCCESS .and. reqs(2) == MPI_REQUEST_NULL)
      call mpi_waitall(3, reqs, statuses, ierr)
      call check("mpi_waitall (ring)", ierr == MPI_SUCCESS)
      ring_status = statuses(:, 1)
    end select
    call check("every request freed", all(reqs == MPI_REQUEST_NULL))
    call check("ring message", ring_in == prev * 100 + c)
    if (have_ring_status) call check("ring receive's status", &
        ring_status(MPI_SOURCE) == prev .and. ring_status(MPI_TAG) == ring_tag)
    call sc_req_check(0, ok)
    call check("allreduce result", ok == 1)
    call mpi_barrier(MPI_COMM_WORLD, ierr)
    call sc_req_watch(0)
  end do

  ! MPI_IALLREDUCE made from Fortran on device memory: routed like a C call from the
  ! communicator's agreement (nccl), its request handed back as a Fortran handle.
  what = "mpi_iallreduce"
  call sc_req_watch(20)
  call sc_req_routed(routed_before)
  call sc_req_buffers(1, 77, send_ptr, recv_ptr)
  call c_f_pointer(send_ptr, fsend, [1000])
  call c_f_pointer(recv_ptr, frecv, [1000])
  call mpi_iallreduce(fsend, frecv, 1000, MPI_INTEGER, MPI_SUM, comm, freq, ierr)
  call check("mpi_iallreduce starts", ierr == MPI_SUCCESS .and. freq /= MPI_REQUEST_NULL)
  call mpi_wait(freq, MPI_STATUS_IGNORE, ierr)
  call check("mpi_wait on it", ierr == MPI_SUCCESS .and. freq == MPI_REQUEST_NULL)
  call sc_req_check(1, ok)
  call check("mpi_iallreduce result", ok == 1)
  call sc_req_routed(routed_after)
  call check("mpi_iallreduce went to route nccl", routed_after == routed_before + 1)
  call sc_req_watch(0)

  call sc_req_finish()
  call mpi_reduce([passed, failed], totals, 2, MPI_INTEGER, MPI_SUM, 0, MPI_COMM_WORLD, ierr)
  if (rank == 0) print '(i0," passed, ",i0," failed")', totals(1), totals(2)
  call mpi_finalize(ierr)
  if (failed > 0) error stop 1

contains

  subroutine check(label, good)
    character(len=*), intent(in) :: label
    logical, intent(in) :: good
    if (good) then
      passed = passed + 1
    else
      failed = failed + 1
      print '("rank ",i0," FAIL ",a,": ",a)', rank, trim(what), label
    end if
  end subroutine

end program
