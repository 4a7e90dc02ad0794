! Persistent collectives and Fortran (mpif.h). Where the MPI has Fortran bindings of them
! (MPICH 4; -DSTREAMCOLL_FORTRAN_PCOLL): MPI_ALLREDUCE_INIT and MPI_BCAST_INIT made once,
! started 100 times (MPI_START + MPI_WAIT, MPI_STARTALL + MPI_WAITALL, MPI_STARTALL +
! MPI_TEST polled, in turn) with new values each time, every value checked; the handles
! are kept (never MPI_REQUEST_NULL) until MPI_REQUEST_FREE. Everywhere (Open MPI 4.1 has
! no Fortran binding of its MPIX_*_init): a persistent allreduce made in C
! (persistent_helper.c) started, waited for (MPI_WAIT, MPI_WAITALL, MPI_TEST, MPI_WAITANY
! in turn) and freed from Fortran, 100 times, its sums checked. With STREAMCOLL_ROUTE set
! the statistics must show every allreduce start on streamcoll (sc_calls("iallreduce")
! >= the starts). Rank 0 prints "N passed, N failed".
program fortran_persistent
  implicit none
  include 'mpif.h'
  interface
    function sc_calls(coll) bind(C, name="sc_calls")
      use, intrinsic :: iso_c_binding, only : c_long_long, c_char
      character(kind=c_char) :: coll(*)
      integer(c_long_long) :: sc_calls
    end function
    subroutine sc_pers_init(req, ierr) bind(C, name="sc_pers_init")
      integer :: req, ierr
    end subroutine
    subroutine sc_pers_fill(k) bind(C, name="sc_pers_fill")
      integer :: k
    end subroutine
    subroutine sc_pers_check(k, ok) bind(C, name="sc_pers_check")
      integer :: k, ok
    end subroutine
  end interface
  integer, parameter :: n = 64, starts = 100
  double precision :: s(n), r(n)
  integer :: b(n)
  integer :: ierr, rank, size, k, j, q, root, passed, failed, total
  integer :: reqs(2), handles(2), st(MPI_STATUS_SIZE, 2)
  logical :: flag, ok
  double precision :: want
  integer(8) :: calls0
  integer :: creq(1), chandle, good, idx

  call MPI_INIT(ierr)
  call MPI_COMM_RANK(MPI_COMM_WORLD, rank, ierr)
  call MPI_COMM_SIZE(MPI_COMM_WORLD, size, ierr)
  passed = 0
  failed = 0
  root = size - 1
  calls0 = sc_calls("iallreduce" // char(0))
  k = 0
  ! A C library's persistent request, completed from Fortran.
  call sc_pers_init(creq(1), ierr)
  call tally(ierr == MPI_SUCCESS .and. creq(1) /= MPI_REQUEST_NULL)
  chandle = creq(1)
  do k = 1, starts
    call sc_pers_fill(k)
    call MPI_START(creq(1), ierr)
    select case (mod(k, 4))
    case (0)
      call MPI_WAIT(creq(1), MPI_STATUS_IGNORE, ierr)
    case (1)
      call MPI_WAITALL(1, creq, MPI_STATUSES_IGNORE, ierr)
    case (2)
      flag = .false.
      do while (.not. flag)
        call MPI_TEST(creq(1), flag, MPI_STATUS_IGNORE, ierr)
      end do
    case default
      call MPI_WAITANY(1, creq, idx, MPI_STATUS_IGNORE, ierr)
    end select
    call sc_pers_check(k, good)
    call tally(ierr == MPI_SUCCESS .and. creq(1) == chandle .and. good == 1)
  end do
  call MPI_REQUEST_FREE(creq(1), ierr)
  call tally(ierr == MPI_SUCCESS .and. creq(1) == MPI_REQUEST_NULL)
  if (len_trim(env("STREAMCOLL_ROUTE")) > 0) &
    call tally(sc_calls("iallreduce" // char(0)) - calls0 >= starts)
#if defined(STREAMCOLL_FORTRAN_PCOLL)
  calls0 = sc_calls("iallreduce" // char(0))
  call MPI_ALLREDUCE_INIT(s, r, n, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD, &
                          MPI_INFO_NULL, reqs(1), ierr)
  call tally(ierr == MPI_SUCCESS .and. reqs(1) /= MPI_REQUEST_NULL)
  call MPI_BCAST_INIT(b, n, MPI_INTEGER, root, MPI_COMM_WORLD, MPI_INFO_NULL, reqs(2), ierr)
  call tally(ierr == MPI_SUCCESS .and. reqs(2) /= MPI_REQUEST_NULL)
  handles = reqs
  do k = 1, starts
    do j = 1, n
      s(j) = dble((rank + 1) * 100 + j + 3 * k)
      b(j) = merge(rank * 1000 + j + k, -1, rank == root)
    end do
    select case (mod(k, 3))
    case (0)
      call MPI_START(reqs(1), ierr)
      call MPI_START(reqs(2), ierr)
      call MPI_WAIT(reqs(1), st(:, 1), ierr)
      call MPI_WAIT(reqs(2), MPI_STATUS_IGNORE, ierr)
    case (1)
      call MPI_STARTALL(2, reqs, ierr)
      call MPI_WAITALL(2, reqs, st, ierr)
    case default
      call MPI_STARTALL(2, reqs, ierr)
      do q = 1, 2
        flag = .false.
        do while (.not. flag)
          call MPI_TEST(reqs(q), flag, MPI_STATUS_IGNORE, ierr)
        end do
      end do
    end select
    call tally(ierr == MPI_SUCCESS .and. reqs(1) == handles(1) .and. reqs(2) == handles(2))
    ok = .true.
    do j = 1, n
      want = 0
      do q = 0, size - 1
        want = want + dble((q + 1) * 100 + j + 3 * k)
      end do
      ok = ok .and. r(j) == want .and. b(j) == root * 1000 + j + k
    end do
    call tally(ok)
  end do
  if (len_trim(env("STREAMCOLL_ROUTE")) > 0) &
    call tally(sc_calls("iallreduce" // char(0)) - calls0 >= starts)
  call MPI_REQUEST_FREE(reqs(1), ierr)
  call tally(ierr == MPI_SUCCESS .and. reqs(1) == MPI_REQUEST_NULL)
  call MPI_REQUEST_FREE(reqs(2), ierr)
  call tally(ierr == MPI_SUCCESS .and. reqs(2) == MPI_REQUEST_NULL)
#endif
  call MPI_ALLREDUCE(failed, total, 1, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, ierr)
  if (rank == 0) print '(I0, " passed, ", I0, " failed")', passed, total
  call MPI_FINALIZE(ierr)
  if (total /= 0) stop 1
contains
  subroutine tally(cond)
    logical, intent(in) :: cond
    if (cond) then
      passed = passed + 1
    else
      failed = failed + 1
      print '("[rank ", I0, "] FAIL at start ", I0)', rank, k
    end if
  end subroutine
  function env(name) result(v)
    character(*), intent(in) :: name
    character(len=256) :: v
    v = ''
    call get_environment_variable(name, v)
  end function
end program
