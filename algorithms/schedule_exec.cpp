#include "algorithms/schedule_exec.hpp"

#include "core/datatypes.hpp"

#include <climits>
#include <cstdlib>
#include <cstring>

namespace streamcoll::sched {

ScheduleRun::ScheduleRun(std::shared_ptr<const Schedule> s, const void* send, void* recv,
                         MPI_Datatype type, int extent, MPI_Op op, MPI_Comm comm, int tag)
    : s_(std::move(s)),
      send_(static_cast<const char*>(send)),
      recv_(static_cast<char*>(recv)),
      type_(type),
      extent_(extent),
      op_(op),
      comm_(comm),
      tag_(tag) {
  if (s_->tmp_elems) tmp_ = static_cast<char*>(std::malloc(s_->tmp_elems * extent_));
}

ScheduleRun::~ScheduleRun() {
  abandon();
  std::free(tmp_);
}

char* ScheduleRun::base(Buf b) const {
  switch (b) {
    case Buf::send: return const_cast<char*>(send_);
    case Buf::recv: return recv_;
    case Buf::tmp: return tmp_;
  }
  return nullptr;
}

int ScheduleRun::post_round() {
  reqs_.clear();
  expect_.clear();
  const uint32_t end = s_->round_end(round_);
  for (uint32_t i = s_->round_begin(round_); i < end; ++i) {
    const Op& o = s_->ops[i];
    if (o.kind != Op::Kind::send && o.kind != Op::Kind::recv) continue;
    char* p = base(o.buf) + o.off * static_cast<uint64_t>(extent_);
    MPI_Request r = MPI_REQUEST_NULL;
    const int n = static_cast<int>(o.count);  // the route declines calls beyond INT_MAX
    const bool send = o.kind == Op::Kind::send;
    // A tainted rank's messages are empty: the receiver sees the taint (see the header).
    int rc = send ? PMPI_Isend(p, tainted_ ? 0 : n, type_, o.peer, tag_, comm_, &r)
                  : PMPI_Irecv(p, n, type_, o.peer, tag_, comm_, &r);
    if (rc != MPI_SUCCESS) return rc;
    reqs_.push_back(r);
    expect_.push_back(send ? -1 : n);
  }
  statuses_.resize(reqs_.size());
  posted_ = true;
  return MPI_SUCCESS;
}

void ScheduleRun::check_received() {
  for (size_t i = 0; i < expect_.size(); ++i) {
    if (expect_[i] < 0) continue;
    int got = 0;
    if (PMPI_Get_count(&statuses_[i], type_, &got) != MPI_SUCCESS || got != expect_[i])
      tainted_ = true;
  }
}

void ScheduleRun::finish_round() {
  const uint32_t end = s_->round_end(round_);
  for (uint32_t i = s_->round_begin(round_); i < end; ++i) {
    const Op& o = s_->ops[i];
    if (o.kind == Op::Kind::send || o.kind == Op::Kind::recv) continue;
    char* dst = base(o.buf) + o.off * static_cast<uint64_t>(extent_);
    const char* src = base(o.src) + o.src_off * static_cast<uint64_t>(extent_);
    if (o.kind == Op::Kind::copy) {
      std::memmove(dst, src, o.count * static_cast<uint64_t>(extent_));
    } else {
      // inoutbuf = inbuf (op) inoutbuf, as MPI_Reduce_local defines it.
      reduce_local(src, dst, static_cast<int>(o.count), type_, op_);
    }
  }
  posted_ = false;
  ++round_;
}

void ScheduleRun::abandon() {
  if (!posted_) return;
  for (MPI_Request& r : reqs_) {
    if (r == MPI_REQUEST_NULL) continue;
    PMPI_Cancel(&r);
    PMPI_Wait(&r, MPI_STATUS_IGNORE);
  }
  reqs_.clear();
  posted_ = false;
}

int ScheduleRun::step(bool* done) {
  *done = false;
  for (;;) {
    if (round_ >= s_->num_rounds()) {
      *done = true;
      return MPI_SUCCESS;
    }
    if (!posted_) {
      if (int rc = post_round(); rc != MPI_SUCCESS) {
        abandon();
        round_ = s_->num_rounds();
        *done = true;
        return rc;
      }
    }
    if (!reqs_.empty()) {
      int flag = 0;
      int rc = PMPI_Testall(static_cast<int>(reqs_.size()), reqs_.data(), &flag,
                            statuses_.data());
      if (rc != MPI_SUCCESS) {
        abandon();
        round_ = s_->num_rounds();
        *done = true;
        return rc;
      }
      if (!flag) return MPI_SUCCESS;
      check_received();
    }
    finish_round();  // and go on to the next round at once
  }
}

int ScheduleRun::run() {
  for (; round_ < s_->num_rounds();) {
    if (int rc = post_round(); rc != MPI_SUCCESS) {
      abandon();
      return rc;
    }
    if (!reqs_.empty()) {
      int rc = PMPI_Waitall(static_cast<int>(reqs_.size()), reqs_.data(), statuses_.data());
      if (rc != MPI_SUCCESS) {
        abandon();
        return rc;
      }
      check_received();
    }
    finish_round();
  }
  return MPI_SUCCESS;
}

}  // namespace streamcoll::sched
