// Route nvgroup's calls (nvgroup_launch.hpp): a call's kernel parameters and rounds, its
// launch in the forms of algorithms/nvgroup.cpp's file comment (classic, attached, MPI_I*
// classic or stream-ordered), the steps that complete an MPI_I*'s request, and a call
// staged through scratch on the group's GPU.
#include "algorithms/nvgroup_launch.hpp"

#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "algorithms/nvgroup_kernel.hpp"
#include "algorithms/nvgroup_module.hpp"
#include "base/log.hpp"
#include "core/call_request.hpp"
#include "core/cuda_driver.hpp"
#include "core/datatypes.hpp"
#include "core/errors.hpp"
#include "core/staging.hpp"
#include "core/stats.hpp"

namespace streamcoll::nvgroup_detail {

using cuda::driver;
using cuda::ScopedContext;

namespace {

constexpr unsigned kThreads = 256;

}  // namespace

nvgroup::Params shape_of(const CollArgs& a, const Group& g, uint64_t* rounds) {
  // The kernel's element type: the reduction's, or for allgather an unsigned type of the
  // datatype's size (bytes when there is none).
  nvgroup::Params p{};
  const bool gather = a.coll == Coll::allgather;
  const TypeInfo* t = find_type(gather ? a.recvtype : a.datatype);
  uint64_t count = static_cast<uint64_t>(gather ? a.recvcount : a.count);  // per block but allreduce
  nvgroup::DType dt;
  if (!gather) {
    dt = *kernel_type(*t);
    p.op = static_cast<uint32_t>(*kernel_op(find_op(a.op)->kind));
  } else if (t->size == 4 || t->size == 8) {
    dt = t->size == 4 ? nvgroup::DType::u32 : nvgroup::DType::u64;
  } else {
    dt = nvgroup::DType::u8;
    count *= static_cast<uint64_t>(t->size);
  }
  p.dtype = static_cast<uint32_t>(dt);
  p.mode = static_cast<uint32_t>(a.coll == Coll::allreduce ? nvgroup::Mode::allreduce
                                 : gather                  ? nvgroup::Mode::allgather
                                                           : nvgroup::Mode::reduce_scatter_block);
  p.count = count;
  p.chunk = g.chunk_bytes / nvgroup::dtype_size(dt);
  p.members = g.members;
  p.me = g.me;
  p.blocks = g.blocks;
  *rounds = nvgroup::rounds_of(p);
  return p;
}

uint64_t reserve(Group& g, uint64_t rounds) {
  std::lock_guard<std::mutex> lock(g.mu);
  const uint64_t seq = g.next_seq;
  g.next_seq += rounds;
  g.last_seq = seq + rounds - 1;
  return seq;
}

// A rank's part staged through scratch on the group's GPU (core/staging.hpp): its
// buffers are elsewhere (host memory, another GPU) while the call was routed from facts
// agreed at an earlier call that said device memory. The input goes to scratch on the
// classic stream before the kernel, which runs in place on it; the results come back on
// the group's copy stream once the kernel is done (back(): after a blocking call's host
// wait, or when a classic MPI_I* request completes), so that nothing here waits for
// another rank. The scratch goes with the Staged, by which time no kernel reads it (done,
// or never launched).
struct Staged {
  std::shared_ptr<Group> g;  // its context outlives the scratch
  staging::GpuStage stage;

  int back() { return stage.finish(g->copy); }
};

namespace {

// A classic MPI_I* call: complete once the event behind its kernel is (never blocking in
// MPI_Test), with the error its status word holds; a staged one once its results are back.
// The staged scratch goes after the event (the release waits for it when unfinished).
CallSteps classic_steps(std::shared_ptr<Group> g, CUevent done, Group::StatusWord w,
                        std::string what, std::shared_ptr<Staged> staged) {
  auto outcome = [g, w, what](CUresult r) {
    if (r != CUDA_SUCCESS) return SC_CU_FAIL(r, what + " (nvgroup)");
    if (__atomic_load_n(w.host, __ATOMIC_ACQUIRE))
      return fail(Failure::cuda, what + " (nvgroup): a rank of the group could not take its part");
    return MPI_SUCCESS;
  };
  CallSteps st;
  st.test = [g, done, outcome](bool* finished) {
    ScopedContext scope(g->cuctx);
    const CUresult r = SC_CU_RESULT(driver().cuEventQuery(done));
    *finished = r != CUDA_ERROR_NOT_READY;
    return *finished ? outcome(r) : MPI_SUCCESS;
  };
  st.wait = [g, done, outcome] {
    ScopedContext scope(g->cuctx);
    return outcome(SC_CU_RESULT(driver().cuEventSynchronize(done)));
  };
  if (staged) st.after = [staged](int rc) { return rc != MPI_SUCCESS ? rc : staged->back(); };
  st.release = [g, done, w, staged](bool finished) {
    ScopedContext scope(g->cuctx);
    if (!finished) SC_CU_TOLERATE(driver().cuEventSynchronize(done));  // the kernel may still use the word
    SC_CU_TOLERATE(driver().cuEventDestroy(done));
    g->give_status(w);
  };
  return st;
}

// A stream-ordered MPI_I* call: MPI_Wait makes the attached stream wait for the event
// behind the kernel (on the side stream) and completes at once.
CallSteps stream_steps(std::shared_ptr<Group> g, CUevent done, CUstream user) {
  CallSteps st;
  st.test = [g, done, user](bool* finished) {
    *finished = true;
    ScopedContext scope(g->cuctx);
    return SC_CU_CHECK(driver().cuStreamWaitEvent(user, done, 0), "nvgroup: cuStreamWaitEvent (MPI_Wait)");
  };
  st.release = [g, done](bool) {
    ScopedContext scope(g->cuctx);
    SC_CU_TOLERATE(driver().cuEventDestroy(done));  // its last record stays valid for waits made on it
  };
  return st;
}

}  // namespace

int launch(const CollArgs& a, const CallEnv& env, std::shared_ptr<Group> g,
           std::shared_ptr<Staged> staged) {
  const cuda::Driver& d = driver();
  uint64_t rounds = 0;
  nvgroup::Params p = shape_of(a, *g, &rounds);
  const uint64_t seq = reserve(*g, rounds);
  const uint64_t ts = nvgroup::dtype_size(static_cast<nvgroup::DType>(p.dtype));
  // A failure the kernel of an earlier stream-ordered call saw: reported now.
  int late = MPI_SUCCESS;
  if (env.has_stream && __atomic_exchange_n(g->status_host(g->me), 0, __ATOMIC_ACQ_REL))
    late = fail(Failure::cuda, "nvgroup: an earlier stream-ordered call on this "
                               "communicator failed on a rank of the group");
  const std::string what = call_name(a.coll, a.nonblocking);
  const bool classic_request = a.nonblocking && !env.has_stream;
  CUstream user = static_cast<CUstream>(env.stream);
  CUstream s = !env.has_stream ? g->classic : a.nonblocking ? g->side : user;
  ScopedContext scope(g->cuctx);
  // This rank cannot take its part: its peers' kernels go on without it (they report
  // the call failed). Its own earlier kernels may still run: they never wait for a
  // failure word, only peers do, so writing it now cannot stop them.
  Group::StatusWord word{nullptr, 0};
  auto lost = [&](int rc) {
    if (word.host) g->give_status(word);
    g->give_up(seq + rounds - 1);
    if (!env.has_stream) d.cuStreamSynchronize(s);  // nothing may still use the buffers
    if (a.nonblocking) *a.request = MPI_REQUEST_NULL;
    return rc;
  };
  // (A rank that has no input to give: a repacked call's that it could not read, or a
  // staged call's that it could not copy.)
  if (env.input_failure != MPI_SUCCESS) return lost(env.input_failure);
  // Ordered after the work the caller's semantics put before it: the legacy stream
  // (classic), the attached stream (a stream-ordered MPI_I*, on the side stream); and
  // after this communicator's previous kernel on this rank, whatever its stream.
  if (!env.has_stream || a.nonblocking) {
    const char* ordering = "nvgroup: ordering the kernel's stream";
    int rc;
    if (!env.has_stream)
      rc = SC_CU_CHECK(cuda::wait_for_legacy(s, g->legacy), ordering);
    else if ((rc = SC_CU_CHECK(d.cuEventRecord(g->legacy, user), ordering)) == MPI_SUCCESS)
      rc = SC_CU_CHECK(d.cuStreamWaitEvent(s, g->legacy, 0), ordering);
    if (rc != MPI_SUCCESS) return lost(rc);
  }
  if (g->last_recorded && g->last_stream != s)
    if (const int rc = SC_CU_CHECK(d.cuStreamWaitEvent(s, g->last, 0), "nvgroup: cuStreamWaitEvent (previous kernel)"))
      return lost(rc);
  // In place: the input is in the output buffer (allgather: this rank's block of it).
  const bool gather = a.coll == Coll::allgather;
  p.send = a.sendbuf != MPI_IN_PLACE ? a.sendbuf
           : gather ? static_cast<const char*>(a.recvbuf) + g->me * p.count * ts
                    : a.recvbuf;
  p.recv = a.recvbuf;
  p.seq = seq;
  for (uint32_t m = 0; m < g->members; ++m)
    p.scratch[m] = reinterpret_cast<char*>(m == g->me ? g->scratch : g->peer[m]);
  p.flags = reinterpret_cast<uint64_t*>(g->segment_dev);
  p.inbox = 2 * g->chunk_bytes;
  p.fails = reinterpret_cast<uint64_t*>(g->segment_dev + kFailOffset);
  p.status = reinterpret_cast<uint64_t*>(g->segment_dev + kStatusOffset) + g->me;
  // Registered inputs: the peers' new registrations mapped, and this rank's input read
  // in place where every peer has its allocation mapped (reduce_scatter_block: unless
  // its output is another block of its input, which a peer reads; never a staged call's
  // scratch, which goes after the call).
  if (g->maps_host) {
    g->map_peers();
    p.maps = reinterpret_cast<const uint64_t*>(g->maps_dev);
    const uint64_t in_bytes = p.count * ts * (a.coll == Coll::reduce_scatter_block ? g->members : 1);
    const auto in = reinterpret_cast<uintptr_t>(p.send), out = reinterpret_cast<uintptr_t>(p.recv);
    const uint64_t out_bytes = p.count * ts;
    const bool clash = a.coll == Coll::reduce_scatter_block && out < in + in_bytes &&
                       in < out + out_bytes && out != in + g->me * out_bytes;
    if (a.coll != Coll::allgather && !clash && !staged)
      p.input = g->input_word(p.send, in_bytes, seq + rounds - 1);
  }
  CUevent done = nullptr;
  if (a.nonblocking) {
    if (classic_request) {
      word = g->take_status();
      if (!word.host)
        return lost(fail(Failure::cuda, "nvgroup: cuMemHostAlloc (status words) failed"));
      p.status = reinterpret_cast<uint64_t*>(word.dev);
    }
    if (const int rc = SC_CU_CHECK(d.cuEventCreate(&done, CU_EVENT_DISABLE_TIMING), "nvgroup: cuEventCreate"))
      return lost(rc);
  }
  void* params[] = {&p};
  if (const int rc = SC_CU_CHECK(d.cuLaunchKernel(g->fn, g->blocks, 1, 1, kThreads, 1, 1, 0, s,
                                                  params, nullptr),
                                 what + " (nvgroup kernel launch)")) {
    if (done) SC_CU_TOLERATE(d.cuEventDestroy(done));
    return lost(rc);
  }
  // Unrecorded, the next call on another stream is not ordered after this one (seen at warn).
  g->last_recorded = SC_CU_TOLERATE(d.cuEventRecord(g->last, s)) == CUDA_SUCCESS;
  g->last_stream = s;
  if (a.nonblocking) {
    // The kernel runs: the request is how the caller learns when its buffers are free.
    // Without one the operation is lost to it, and a classic caller waits here.
    int rc = SC_CU_CHECK(d.cuEventRecord(done, s), "nvgroup: cuEventRecord");
    if (rc != MPI_SUCCESS) {
      SC_CU_TOLERATE(d.cuEventDestroy(done));
    } else if (classic_request) {
      rc = start_call_request(classic_steps(g, done, word, what, std::move(staged)), a.request);
      word = Group::StatusWord{nullptr, 0};  // the request's now (or given back with it)
    } else {
      rc = start_call_request(stream_steps(g, done, user), a.request);
    }
    if (rc != MPI_SUCCESS) {
      if (word.host) g->give_status(word);
      if (!env.has_stream) d.cuStreamSynchronize(s);
      *a.request = MPI_REQUEST_NULL;
      return rc;
    }
    return late;
  }
  if (env.has_stream) return late;
  if (const int rc = SC_CU_CHECK(d.cuStreamSynchronize(s), what + " (nvgroup)")) return lost(rc);
  if (__atomic_exchange_n(g->status_host(g->me), 0, __ATOMIC_ACQ_REL))
    return fail(Failure::cuda, what + " (nvgroup): a rank of the group could not take its part");
  return MPI_SUCCESS;
}

int run_staged(const CollArgs& a, CommContext& ctx, const CallEnv& env, std::shared_ptr<Group> g) {
  auto st = std::make_shared<Staged>();
  st->g = g;
  int rc = MPI_SUCCESS;
  {
    const cuda::Driver& d = driver();
    ScopedContext scope(g->cuctx);
    CUresult made = CUDA_SUCCESS;
    std::call_once(g->copy_once, [&] { made = d.cuStreamCreate(&g->copy, CU_STREAM_NON_BLOCKING); });
    if (!g->copy)
      rc = SC_CU_FAIL(made ? made : CUDA_ERROR_INVALID_HANDLE, "nvgroup: cuStreamCreate (staging)");
    if (rc == MPI_SUCCESS)
      rc = st->stage.in(a, ctx.rank, ctx.size, g->cuctx, g->classic,
                        env.has_stream ? static_cast<CUstream>(env.stream) : nullptr, "nvgroup");
  }
  // A failure: the kernel is not launched, and this rank gives its rounds up.
  if (rc != MPI_SUCCESS) return launch(a, staged_env(env, g->device, rc), g, nullptr);
  rc = launch(st->stage.args(a), staged_env(env, g->device, MPI_SUCCESS), g, st);
  if (a.nonblocking || rc != MPI_SUCCESS) return rc;  // (an MPI_I*'s request brings them back)
  return st->back();
}

}  // namespace streamcoll::nvgroup_detail
