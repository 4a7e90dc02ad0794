! Fortran calls take routes: every Fortran datatype streamcoll routes (MPI_INTEGER, REAL,
! DOUBLE PRECISION, COMPLEX, DOUBLE COMPLEX, LOGICAL and the sized INTEGER1/2/4/8, REAL4/8,
! COMPLEX8/16) through every collective a host route takes, blocking and non-blocking, in
! place and not, through mpif.h, `use mpi` (-DSTREAMCOLL_USE_MPI) or `use mpi_f08`
! (-DSTREAMCOLL_F08). Each result is checked against values computed here; with
! STREAMCOLL_EXPECT_INTERCEPT=1 each
! call must have taken the route STREAMCOLL_ROUTE forces for its collective (pmpi where
! it forces none), by streamcoll's statistics (routes_helper.c). Rank 0 prints
! "N passed, N failed". Under STREAMCOLL_TEST_DEVICE=1 the buffers are fake device memory
! (the fake CUDA driver; a route NCCL's reductions cannot carry, complex, LOGICAL,
! INTEGER2, is expected on pmpi).
program fortran_routes
  use iso_c_binding
#if defined(STREAMCOLL_F08)
  use mpi_f08
  implicit none
#define REQ type(MPI_Request)
#elif defined(STREAMCOLL_USE_MPI)
  use mpi
  implicit none
#define REQ integer
#else
  implicit none
  include 'mpif.h'
#define REQ integer
#endif
  interface
    integer(c_long_long) function sc_route_calls(name, reducible) bind(C, name="sc_route_calls")
      import :: c_char, c_long_long, c_int
      character(kind=c_char), dimension(*) :: name
      integer(c_int), value :: reducible
    end function
    integer(c_int) function sc_device_mode() bind(C, name="sc_device_mode")
      import :: c_int
    end function
    type(c_ptr) function sc_dev_alloc(bytes) bind(C, name="sc_dev_alloc")
      import :: c_ptr, c_size_t
      integer(c_size_t), value :: bytes
    end function
    subroutine sc_dev_free(p) bind(C, name="sc_dev_free")
      import :: c_ptr
      type(c_ptr), value :: p
    end subroutine
  end interface

  integer, parameter :: n = 7
  integer :: ierr, rank, nranks, passed, failed, totals(2)
  logical :: check_routes, device
  character(len=8) :: env
  integer(c_long_long) :: before

  call mpi_init(ierr)
  call mpi_comm_rank(MPI_COMM_WORLD, rank, ierr)
  call mpi_comm_size(MPI_COMM_WORLD, nranks, ierr)
  call get_environment_variable("STREAMCOLL_EXPECT_INTERCEPT", env)
  check_routes = env == "1"
  device = sc_device_mode() == 1
  passed = 0
  failed = 0

  call integer_default()
  call integer1()
  call integer2()
  call integer4()
  call integer8()
  call real_default()
  call double_precision()
  call real4()
  call real8()
  call complex_default()
  call double_complex()
  call complex8()
  call complex16()
  call logical_default()

  call mpi_reduce([passed, failed], totals, 2, MPI_INTEGER, MPI_SUM, 0, MPI_COMM_WORLD, ierr)
  if (rank == 0) print '(i0," passed, ",i0," failed")', totals(1), totals(2)
  call mpi_finalize(ierr)
  if (failed > 0) error stop 1

contains

  ! The calls of `name` so far on the route expected for this one (`reducible`: the
  ! datatype is one NCCL reduces; moving data, any is).
  integer(c_long_long) function route_calls(name, reducible)
    character(len=*), intent(in) :: name
    logical, intent(in), optional :: reducible
    integer(c_int) :: r
    r = 1
    if (present(reducible)) then
      if (.not. reducible) r = 0
    end if
    route_calls = sc_route_calls(trim(name) // c_null_char, r)
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

  subroutine routed(name, before, reducible)
    character(len=*), intent(in) :: name
    integer(c_long_long), intent(in) :: before
    logical, intent(in), optional :: reducible
    if (check_routes) call check(name // " on its route", route_calls(name, reducible) == before + 1)
  end subroutine

! The test's buffers: fake device memory under STREAMCOLL_TEST_DEVICE=1, else host.
#define MAKE(a, m) if (device) then; call c_f_pointer(sc_dev_alloc(int(m, c_size_t) * storage_size(a) / 8), a, [m]); else; allocate(a(m)); end if
#define DROP(a) if (device) then; call sc_dev_free(c_loc(a)); else; deallocate(a); end if

#define FT integer
#define MT MPI_INTEGER
#define TN "MPI_INTEGER"
#define CV(v) int(v)
#define NR .true.
  subroutine integer_default()
#include "routes_numeric.inc"
  end subroutine
#undef FT
#undef MT
#undef TN
#undef CV
#undef NR

#define FT integer(kind=1)
#define MT MPI_INTEGER1
#define TN "MPI_INTEGER1"
#define CV(v) int(v, kind=1)
#define NR .true.
  subroutine integer1()
#include "routes_numeric.inc"
  end subroutine
#undef FT
#undef MT
#undef TN
#undef CV
#undef NR

#define FT integer(kind=2)
#define MT MPI_INTEGER2
#define TN "MPI_INTEGER2"
#define CV(v) int(v, kind=2)
#define NR .false.
  subroutine integer2()
#include "routes_numeric.inc"
  end subroutine
#undef FT
#undef MT
#undef TN
#undef CV
#undef NR

#define FT integer(kind=4)
#define MT MPI_INTEGER4
#define TN "MPI_INTEGER4"
#define CV(v) int(v, kind=4)
#define NR .true.
  subroutine integer4()
#include "routes_numeric.inc"
  end subroutine
#undef FT
#undef MT
#undef TN
#undef CV
#undef NR

#define FT integer(kind=8)
#define MT MPI_INTEGER8
#define TN "MPI_INTEGER8"
#define CV(v) int(v, kind=8)
#define NR .true.
  subroutine integer8()
#include "routes_numeric.inc"
  end subroutine
#undef FT
#undef MT
#undef TN
#undef CV
#undef NR

#define FT real
#define MT MPI_REAL
#define TN "MPI_REAL"
#define CV(v) real(v)
#define NR .true.
  subroutine real_default()
#include "routes_numeric.inc"
  end subroutine
#undef FT
#undef MT
#undef TN
#undef CV
#undef NR

#define FT double precision
#define MT MPI_DOUBLE_PRECISION
#define TN "MPI_DOUBLE_PRECISION"
#define CV(v) dble(v)
#define NR .true.
  subroutine double_precision()
#include "routes_numeric.inc"
  end subroutine
#undef FT
#undef MT
#undef TN
#undef CV
#undef NR

#define FT real(kind=4)
#define MT MPI_REAL4
#define TN "MPI_REAL4"
#define CV(v) real(v, kind=4)
#define NR .true.
  subroutine real4()
#include "routes_numeric.inc"
  end subroutine
#undef FT
#undef MT
#undef TN
#undef CV
#undef NR

#define FT real(kind=8)
#define MT MPI_REAL8
#define TN "MPI_REAL8"
#define CV(v) real(v, kind=8)
#define NR .true.
  subroutine real8()
#include "routes_numeric.inc"
  end subroutine
#undef FT
#undef MT
#undef TN
#undef CV
#undef NR

#define FT complex
#define MT MPI_COMPLEX
#define TN "MPI_COMPLEX"
#define CV(re, im) cmplx(re, im)
#define NR .false.
  subroutine complex_default()
#include "routes_complex.inc"
  end subroutine
#undef FT
#undef MT
#undef TN
#undef CV
#undef NR

#define FT double complex
#define MT MPI_DOUBLE_COMPLEX
#define TN "MPI_DOUBLE_COMPLEX"
#define CV(re, im) cmplx(re, im, kind=kind(0.0d0))
#define NR .false.
  subroutine double_complex()
#include "routes_complex.inc"
  end subroutine
#undef FT
#undef MT
#undef TN
#undef CV
#undef NR

#define FT complex(kind=4)
#define MT MPI_COMPLEX8
#define TN "MPI_COMPLEX8"
#define CV(re, im) cmplx(re, im, kind=4)
#define NR .false.
  subroutine complex8()
#include "routes_complex.inc"
  end subroutine
#undef FT
#undef MT
#undef TN
#undef CV
#undef NR

#define FT complex(kind=8)
#define MT MPI_COMPLEX16
#define TN "MPI_COMPLEX16"
#define CV(re, im) cmplx(re, im, kind=8)
#define NR .false.
  subroutine complex16()
#include "routes_complex.inc"
  end subroutine
#undef FT
#undef MT
#undef TN
#undef CV
#undef NR

#define FT logical
#define MT MPI_LOGICAL
#define TN "MPI_LOGICAL"
#define NR .false.
  subroutine logical_default()
#include "routes_logical.inc"
  end subroutine
#undef FT
#undef MT
#undef TN
#undef NR

end program
