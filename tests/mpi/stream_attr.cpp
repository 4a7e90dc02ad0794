// The stream attribute's bookkeeping (include/streamcoll/streamext.h), without a GPU:
// attach, read back, replace, detach, MPI_Comm_dup copies it, MPI_Comm_split does not,
// MPI_Comm_free with it attached, errors on MPI_COMM_NULL; and host-buffer collectives on
// a communicator that carries a stream keep plain MPI semantics (the stream handle is
// never touched for host memory, so a made-up handle is safe here).
// Without streamcoll (plain run, or STREAMCOLL_DISABLE=1) every helper must report
// STREAMCOLL_ERR_ABSENT. Prints "N passed, N failed" on rank 0; exits nonzero on failure.
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "streamcoll/streamext.h"

namespace {

int g_pass = 0, g_fail = 0, g_rank = 0;

void check(bool ok, const std::string& what) {
  if (ok) {
    ++g_pass;
  } else {
    ++g_fail;
    std::fprintf(stderr, "[rank %d] FAIL: %s\n", g_rank, what.c_str());
  }
}

bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v && std::strcmp(v, value) == 0;
}

streamcoll_stream_t fake_stream(uintptr_t v) { return reinterpret_cast<streamcoll_stream_t>(v); }

void absent_case() {
  check(streamcoll_stream_keyval() == MPI_KEYVAL_INVALID, "no keyval without streamcoll");
  check(!streamcoll_stream_available(), "not available");
  check(streamcoll_comm_attach_stream(MPI_COMM_WORLD, fake_stream(0x100)) == STREAMCOLL_ERR_ABSENT,
        "attach reports absent");
  streamcoll_stream_t s = fake_stream(0x5);
  int flag = 7;
  check(streamcoll_comm_get_stream(MPI_COMM_WORLD, &s, &flag) == STREAMCOLL_ERR_ABSENT &&
            flag == 0 && s == fake_stream(0x5),
        "get reports absent, flag 0, stream untouched");
  check(streamcoll_comm_detach_stream(MPI_COMM_WORLD) == STREAMCOLL_ERR_ABSENT,
        "detach reports absent");
  streamcoll::ScopedStream scoped(MPI_COMM_WORLD, fake_stream(0x100));
  check(!scoped.attached(), "ScopedStream not attached");
}

// Reads back the stream of `comm`: returns the handle, or 0 with *flag == 0.
uintptr_t stream_of(MPI_Comm comm, int* flag) {
  streamcoll_stream_t s = nullptr;
  int rc = streamcoll_comm_get_stream(comm, &s, flag);
  check(rc == MPI_SUCCESS, "get_stream succeeds");
  return *flag ? reinterpret_cast<uintptr_t>(s) : 0;
}

// Host-buffer collectives on `comm`, compared with values computed here.
void host_collectives(MPI_Comm comm, const std::string& label) {
  int rank, size;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const int n = 1000;
  std::vector<double> in(n), out(n, -1.0);
  for (int i = 0; i < n; ++i) in[i] = rank * 1000.0 + i;
  MPI_Allreduce(in.data(), out.data(), n, MPI_DOUBLE, MPI_SUM, comm);
  bool ok = true;
  for (int i = 0; i < n; ++i)
    ok = ok && out[i] == 1000.0 * size * (size - 1) / 2 + static_cast<double>(i) * size;
  check(ok, label + ": MPI_Allreduce on host buffers");

  std::vector<int> all(size, -1);
  MPI_Request req;
  MPI_Iallgather(&rank, 1, MPI_INT, all.data(), 1, MPI_INT, comm, &req);
  MPI_Wait(&req, MPI_STATUS_IGNORE);
  ok = true;
  for (int r = 0; r < size; ++r) ok = ok && all[r] == r;
  check(ok, label + ": MPI_Iallgather + MPI_Wait on host buffers");

  long v = rank == size - 1 ? 42 : -1;
  MPI_Bcast(&v, 1, MPI_LONG, size - 1, comm);
  check(v == 42, label + ": MPI_Bcast on host buffers");
}

void present_case() {
  const int keyval = streamcoll_stream_keyval();
  check(keyval != MPI_KEYVAL_INVALID, "keyval exists");
  check(streamcoll_stream_keyval() == keyval, "the same keyval on every call");
  check(streamcoll_stream_available() == 1, "available");

  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  int flag = 1;
  check(stream_of(comm, &flag) == 0 && flag == 0, "a new communicator carries no stream");
  check(streamcoll_comm_detach_stream(comm) == MPI_SUCCESS, "detaching nothing is no error");

  const uintptr_t s1 = 0x1000 + static_cast<uintptr_t>(g_rank), s2 = 0x2000;
  check(streamcoll_comm_attach_stream(comm, fake_stream(s1)) == MPI_SUCCESS, "attach");
  check(stream_of(comm, &flag) == s1 && flag == 1, "read back the attached stream");
  check(streamcoll_comm_attach_stream(comm, fake_stream(s2)) == MPI_SUCCESS, "attach again");
  check(stream_of(comm, &flag) == s2 && flag == 1, "the second attach replaces the first");
  check(streamcoll_comm_attach_stream(comm, nullptr) == MPI_SUCCESS, "attach stream 0");
  check(stream_of(comm, &flag) == 0 && flag == 1, "stream 0 (legacy default) is attached");
  check(streamcoll_comm_attach_stream(comm, fake_stream(s1)) == MPI_SUCCESS, "attach s1");

  // Plain MPI on the attribute: the value is the stream handle itself.
  void* raw = nullptr;
  int found = 0;
  MPI_Comm_get_attr(comm, keyval, &raw, &found);
  check(found && reinterpret_cast<uintptr_t>(raw) == s1, "MPI_Comm_get_attr gives the handle");

  MPI_Comm dup, split;
  MPI_Comm_dup(comm, &dup);
  check(stream_of(dup, &flag) == s1 && flag == 1, "MPI_Comm_dup keeps the stream");
  MPI_Comm_split(comm, g_rank % 2, g_rank, &split);
  stream_of(split, &flag);
  check(flag == 0, "MPI_Comm_split does not copy the stream");

  host_collectives(comm, "attached");
  host_collectives(dup, "dup");
  host_collectives(split, "split");

  check(streamcoll_comm_detach_stream(dup) == MPI_SUCCESS, "detach the dup");
  stream_of(dup, &flag);
  check(flag == 0, "detached: no stream");
  check(stream_of(comm, &flag) == s1 && flag == 1, "detaching the dup leaves the original");
  host_collectives(dup, "detached");

  {
    streamcoll::ScopedStream scoped(split, fake_stream(s2));
    check(scoped.attached(), "ScopedStream attached");
    check(stream_of(split, &flag) == s2 && flag == 1, "ScopedStream: stream attached");
  }
  stream_of(split, &flag);
  check(flag == 0, "ScopedStream detaches at scope end");

  // Errors come back as the MPI's own (MPI_ERRORS_RETURN on MPI_COMM_WORLD).
  int rc = streamcoll_comm_attach_stream(MPI_COMM_NULL, fake_stream(s1));
  int cls = MPI_SUCCESS;
  if (rc != MPI_SUCCESS) MPI_Error_class(rc, &cls);
  check(rc != MPI_SUCCESS && cls == MPI_ERR_COMM, "attach to MPI_COMM_NULL: MPI_ERR_COMM");

  // Freed with the stream attached (the delete callback runs), and one left attached to
  // a communicator that is never freed, for MPI_Finalize to clean up.
  MPI_Comm_free(&dup);
  MPI_Comm_free(&split);
  MPI_Comm_free(&comm);
  check(streamcoll_comm_attach_stream(MPI_COMM_WORLD, fake_stream(s2)) == MPI_SUCCESS,
        "attach to MPI_COMM_WORLD");
  host_collectives(MPI_COMM_WORLD, "world");
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  const bool present =
      env_is("STREAMCOLL_EXPECT_INTERCEPT", "1") && !env_is("STREAMCOLL_DISABLE", "1");
  if (present)
    present_case();
  else
    absent_case();
  int counts[2] = {g_pass, g_fail}, total[2] = {0, 0};
  MPI_Reduce(counts, total, 2, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
  if (g_rank == 0)
    std::printf("stream_attr (%s): %d passed, %d failed\n", present ? "streamcoll present"
                                                                    : "streamcoll absent",
                total[0], total[1]);
  MPI_Finalize();
  return total[1] == 0 && g_fail == 0 ? 0 : 1;
}
