! The collectives through the Fortran bindings: mpif.h (`use mpi` calls the same symbols),
! or `use mpi_f08` when built with -DSTREAMCOLL_F08 (ierror then left out of some calls).
! Results checked against values computed here, MPI_IN_PLACE included; with
! STREAMCOLL_EXPECT_INTERCEPT=1 every call must be counted once by streamcoll. Rank 0
! prints "N passed, N failed".
program fortran_collectives
  use iso_c_binding
#ifdef STREAMCOLL_F08
  use mpi_f08
  implicit none
#else
  implicit none
  include 'mpif.h'
#endif
  interface
    integer(c_long_long) function sc_calls(name) bind(C, name="sc_calls")
      import :: c_char, c_long_long
      character(kind=c_char), dimension(*) :: name
    end function
  end interface

  integer, parameter :: n = 7
  integer :: ierr, rank, nranks, i, r, root, passed, failed, totals(2)
#ifdef STREAMCOLL_F08
  type(MPI_Request) :: req, reqs(3)
#else
  integer :: req, reqs(3)
#endif
  integer :: a(n), b(n), expect_i(n)
  integer, allocatable :: gathered(:), counts(:), displs(:), sendv(:), recvv(:)
  double precision :: d(n), e(n)
  logical :: check_counts
  character(len=8) :: env
  integer(c_long_long) :: before

#ifdef STREAMCOLL_F08
  call mpi_init()  ! ierror left out
#else
  call mpi_init(ierr)
#endif
  call mpi_comm_rank(MPI_COMM_WORLD, rank, ierr)
  call mpi_comm_size(MPI_COMM_WORLD, nranks, ierr)
  call get_environment_variable("STREAMCOLL_EXPECT_INTERCEPT", env)
  check_counts = env == "1"
  passed = 0
  failed = 0

  ! allreduce, not in place and in place
  before = calls("allreduce")
  a = [(rank + i, i = 1, n)]
  call mpi_allreduce(a, b, n, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, ierr)
  expect_i = [(nranks * i + nranks * (nranks - 1) / 2, i = 1, n)]
  call check("allreduce", ierr == 0 .and. all(b == expect_i))
  call counted("allreduce", before)
  before = calls("allreduce")
  d = [(dble(rank) * 0.5d0 + i, i = 1, n)]
#ifdef STREAMCOLL_F08
  ierr = 0
  call mpi_allreduce(MPI_IN_PLACE, d, n, MPI_DOUBLE_PRECISION, MPI_MAX, MPI_COMM_WORLD)
#else
  call mpi_allreduce(MPI_IN_PLACE, d, n, MPI_DOUBLE_PRECISION, MPI_MAX, MPI_COMM_WORLD, ierr)
#endif
  e = [(dble(nranks - 1) * 0.5d0 + i, i = 1, n)]
  call check("allreduce in place", ierr == 0 .and. all(d == e))
  call counted("allreduce", before)

  ! reduce to every root, in place at the root
  do root = 0, nranks - 1
    before = calls("reduce")
    a = [(rank * i, i = 1, n)]
    b = -1
    if (rank == root) then
      b = a
      call mpi_reduce(MPI_IN_PLACE, b, n, MPI_INTEGER, MPI_MAX, root, MPI_COMM_WORLD, ierr)
      call check("reduce in place", ierr == 0 .and. all(b == [((nranks - 1) * i, i = 1, n)]))
    else
      call mpi_reduce(a, b, n, MPI_INTEGER, MPI_MAX, root, MPI_COMM_WORLD, ierr)
      call check("reduce", ierr == 0)
    end if
    call counted("reduce", before)
  end do

  ! bcast from every root
  do root = 0, nranks - 1
    before = calls("bcast")
    a = -1
    if (rank == root) a = [(100 * root + i, i = 1, n)]
    call mpi_bcast(a, n, MPI_INTEGER, root, MPI_COMM_WORLD, ierr)
    call check("bcast", ierr == 0 .and. all(a == [(100 * root + i, i = 1, n)]))
    call counted("bcast", before)
  end do

  ! allgather and allgatherv (rank r sends r+1 values r*10+k)
  allocate(gathered(nranks * 2), counts(nranks), displs(nranks))
  before = calls("allgather")
  call mpi_allgather([rank, -rank], 2, MPI_INTEGER, gathered, 2, MPI_INTEGER, MPI_COMM_WORLD, ierr)
  call check("allgather", ierr == 0 .and. &
             all(gathered == [((r * (3 - 2 * i), i = 1, 2), r = 0, nranks - 1)]))
  call counted("allgather", before)
  counts = [(r + 1, r = 0, nranks - 1)]
  displs(1) = 0
  do r = 2, nranks
    displs(r) = displs(r - 1) + counts(r - 1)
  end do
  allocate(recvv(sum(counts)), sendv(rank + 1))
  sendv = [(rank * 10 + i, i = 1, rank + 1)]
  before = calls("allgatherv")
  call mpi_allgatherv(sendv, rank + 1, MPI_INTEGER, recvv, counts, displs, MPI_INTEGER, &
                      MPI_COMM_WORLD, ierr)
  call check("allgatherv", ierr == 0 .and. all(recvv == [((r * 10 + i, i = 1, r + 1), r = 0, nranks - 1)]))
  call counted("allgatherv", before)
  deallocate(recvv, sendv)

  ! reduce_scatter_block and reduce_scatter: element j (0-based) of rank p's input is p + j
  allocate(sendv(2 * nranks), recvv(2))
  sendv = [(rank + i, i = 0, 2 * nranks - 1)]
  before = calls("reduce_scatter_block")
  call mpi_reduce_scatter_block(sendv, recvv, 2, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, ierr)
  call check("reduce_scatter_block", ierr == 0 .and. &
             all(recvv == [(nranks * (2 * rank + i) + nranks * (nranks - 1) / 2, i = 0, 1)]))
  call counted("reduce_scatter_block", before)
  counts = 2
  before = calls("reduce_scatter")
  call mpi_reduce_scatter(sendv, recvv, counts, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, ierr)
  call check("reduce_scatter", ierr == 0 .and. &
             all(recvv == [(nranks * (2 * rank + i) + nranks * (nranks - 1) / 2, i = 0, 1)]))
  call counted("reduce_scatter", before)

  ! alltoall: rank p sends p*100+q to rank q
  before = calls("alltoall")
  sendv(1:nranks) = [(rank * 100 + r, r = 0, nranks - 1)]
  call mpi_alltoall(sendv, 1, MPI_INTEGER, gathered, 1, MPI_INTEGER, MPI_COMM_WORLD, ierr)
  call check("alltoall", ierr == 0 .and. all(gathered(1:nranks) == [(r * 100 + rank, r = 0, nranks - 1)]))
  call counted("alltoall", before)

  before = calls("barrier")
#ifdef STREAMCOLL_F08
  ierr = 0
  call mpi_barrier(MPI_COMM_WORLD)
#else
  call mpi_barrier(MPI_COMM_WORLD, ierr)
#endif
  call check("barrier", ierr == 0)
  call counted("barrier", before)

  ! non-blocking, completed by mpi_wait and mpi_waitall
  before = calls("iallreduce")
  a = [(rank + i, i = 1, n)]
  call mpi_iallreduce(MPI_IN_PLACE, a, n, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, req, ierr)
  call mpi_wait(req, MPI_STATUS_IGNORE, ierr)
  call check("iallreduce", ierr == 0 .and. all(a == [(nranks * i + nranks * (nranks - 1) / 2, i = 1, n)]))
  call counted("iallreduce", before)
  b = -1
  if (rank == 0) b = 42
  call mpi_ibcast(b, n, MPI_INTEGER, 0, MPI_COMM_WORLD, reqs(1), ierr)
  call mpi_iallgather(rank, 1, MPI_INTEGER, gathered, 1, MPI_INTEGER, MPI_COMM_WORLD, reqs(2), ierr)
  call mpi_ibarrier(MPI_COMM_WORLD, reqs(3), ierr)
  call mpi_waitall(3, reqs, MPI_STATUSES_IGNORE, ierr)
  call check("ibcast/iallgather/ibarrier", ierr == 0 .and. all(b == 42) .and. &
             all(gathered(1:nranks) == [(r, r = 0, nranks - 1)]))
  if (check_counts) then
    call check("ibcast counted", calls("ibcast") == 1)
    call check("iallgather counted", calls("iallgather") == 1)
    call check("ibarrier counted", calls("ibarrier") == 1)
  end if

  ! bad input: the same error as MPI gives (negative count -> MPI_ERR_COUNT)
  call mpi_comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN, ierr)
  call mpi_allreduce(a, b, -1, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, ierr)
#ifdef STREAMCOLL_F08
  call mpi_error_class(ierr, i)
#else
  call mpi_error_class(ierr, i, r)
#endif
  call check("negative count", i == MPI_ERR_COUNT)

  call mpi_reduce([passed, failed], totals, 2, MPI_INTEGER, MPI_SUM, 0, MPI_COMM_WORLD, ierr)
  if (rank == 0) print '(i0," passed, ",i0," failed")', totals(1), totals(2)
  call mpi_finalize(ierr)
  if (failed > 0) error stop 1

contains

  integer(c_long_long) function calls(name)
    character(len=*), intent(in) :: name
    calls = sc_calls(trim(name) // c_null_char)
  end function

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

  subroutine counted(name, before)
    character(len=*), intent(in) :: name
    integer(c_long_long), intent(in) :: before
    if (check_counts) call check(name // " counted once", calls(name) == before + 1)
  end subroutine

end program
