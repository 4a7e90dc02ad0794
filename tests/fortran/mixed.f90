! Ranks that call one collective from different languages: even ranks through the Fortran
! binding (mpif.h), odd ranks through C (mixed_helper.c), each call the same collective
! with the same datatype (MPI_REAL, MPI_INTEGER) on host arrays, in a process that loaded
! a CUDA driver (the fake one of tests/fake) under an MPI that is not CUDA-aware: so
! streamcoll carries the ranks' staging outcomes (in band in a small MPI_Allreduce) until
! the ranks' agreed facts say host memory everywhere, and none after: each call must take
! the same form whatever language a rank calls from.
! MPI_ALLREDUCE, MPI_REDUCE (every root), MPI_BCAST (every root), MPI_ALLGATHER, at
! several sizes, each value checked against one computed here; an alarm fails a hang.
! Rank 0 prints "N passed, N failed".
program mixed
  implicit none
  include 'mpif.h'
  interface
    subroutine sc_mixed_watch(seconds) bind(C, name="sc_mixed_watch")
      integer :: seconds
    end subroutine
    subroutine sc_mixed_call(what, n, root, send, recv, ierr) bind(C, name="sc_mixed_call")
      integer :: what, n, root, ierr
      real :: send(*), recv(*)
    end subroutine
  end interface
  integer, parameter :: maxn = 4096
  real :: send(maxn), recv(maxn * 8), want
  integer :: ierr, rank, size, n, ni, root, what, i, j, passed, failed, tot(2), rep
  integer :: sizes(4)
  logical :: ok
  data sizes /1, 2, 100, 4096/

  call mpi_init(ierr)
  call mpi_comm_rank(MPI_COMM_WORLD, rank, ierr)
  call mpi_comm_size(MPI_COMM_WORLD, size, ierr)
  call sc_mixed_watch(60)
  passed = 0
  failed = 0
  do rep = 1, 3               ! each signature again: later calls decide from earlier facts
  do ni = 1, 4
    n = sizes(ni)
    do what = 1, 4            ! 1 allreduce, 2 reduce, 3 bcast, 4 allgather
      do root = 0, size - 1
        if (what == 1 .or. what == 4) then
          if (root > 0) exit  ! no root
        end if
        do i = 1, n
          send(i) = real(rank + 1) + real(mod(i, 7))
        end do
        recv = -1.0
        if (what == 3 .and. rank == root) recv(1:n) = send(1:n)
        if (mod(rank, 2) == 0) then
          select case (what)
          case (1)
            call mpi_allreduce(send, recv, n, MPI_REAL, MPI_SUM, MPI_COMM_WORLD, ierr)
          case (2)
            call mpi_reduce(send, recv, n, MPI_REAL, MPI_SUM, root, MPI_COMM_WORLD, ierr)
          case (3)
            call mpi_bcast(recv, n, MPI_REAL, root, MPI_COMM_WORLD, ierr)
          case (4)
            call mpi_allgather(send, n, MPI_REAL, recv, n, MPI_REAL, MPI_COMM_WORLD, ierr)
          end select
        else
          call sc_mixed_call(what, n, root, send, recv, ierr)
        end if
        ok = ierr == MPI_SUCCESS
        do i = 1, n
          select case (what)
          case (1, 2)
            want = real(size * (size + 1) / 2) + real(size * mod(i, 7))
            if (what == 1 .or. rank == root) ok = ok .and. recv(i) == want
          case (3)
            want = real(root + 1) + real(mod(i, 7))
            ok = ok .and. recv(i) == want
          case (4)
            do j = 0, size - 1
              want = real(j + 1) + real(mod(i, 7))
              ok = ok .and. recv(j * n + i) == want
            end do
          end select
        end do
        if (ok) then
          passed = passed + 1
        else
          failed = failed + 1
          print '(a,i0,a,i0,a,i0,a,i0,a,i0)', 'FAILED: rank ', rank, ' collective ', what, &
            ' n ', n, ' root ', root, ' ierr ', ierr
        end if
      end do
    end do
  end do
  end do
  call mpi_reduce((/passed, failed/), tot, 2, MPI_INTEGER, MPI_SUM, 0, MPI_COMM_WORLD, ierr)
  if (rank == 0) print '(i0,a,i0,a)', tot(1), ' passed, ', tot(2), ' failed'
  call mpi_finalize(ierr)
  if (rank == 0 .and. tot(2) /= 0) stop 1
end program mixed
