// The CSV that bench/sc_bench writes (--csv FILE) and the tools read (sc_tune, the
// profile fit of sc_model). One header line, then one row per (route, size):
//
//   coll,dtype,op,mem,stream,ranks,nodes,ppn,spec,route,taken,bytes,count,iters,
//   min_us,median_us,max_us,host_us,algbw_GBps,busbw_GBps,valid,rule,burst
//
//   coll      collective name (allreduce, reduce, bcast, allgather,
//             reduce_scatter_block, alltoall)
//   dtype/op  MPI names without the prefix (float, sum)
//   mem       host or device (the buffers' memory kind)
//   stream    1 with the stream attribute, 0 without; -1 either (sc_model's predicted
//             rows: the models do not depend on it)
//   ranks     communicator size; nodes: nodes it spans; ppn: most ranks on one node
//   spec      the route as forced (streamcoll_comm_set_route syntax without the
//             collective: "ht:algo=rd"), or "table" (nothing forced: the tuning table)
//   route     spec in tuning-table syntax ("ht algo=rd"; "table")
//   taken     the route the timed calls went to, from streamcoll's statistics ("pmpi",
//             "ht", ...); "-" unknown (no statistics), "mixed" more than one
//   bytes     the size in the CallKey::bytes (nccl-tests) convention; count: elements
//             per rank passed to the call
//   iters     timed iterations; *_us: min/median/max over them of the slowest rank's
//             time per call, microseconds; host_us: median time the calling thread spent
//             in the call (the host-blocking time)
//   algbw_GBps, busbw_GBps  bytes / median time, and that times nccl-tests' bus factor
//   valid     1 when every checked result was right
//   rule      the route with its parameters that the last timed call took, from
//             streamcoll_last_route ("ht algo=rd"; "-" unknown); optional when reading
//   burst     0: each timed call is one call; N (sc_bench --burst N, allreduce): each timed
//             call is N MPI_Iallreduce and one MPI_Waitall, and the times are per
//             MPI_Iallreduce (what fusion, fuse=, is measured by); optional when reading (0)
//
// Columns are found by name, so readers accept extra columns and any order.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "config/table_builder.hpp"

namespace streamcoll::config {

struct BenchRow {
  std::string coll, dtype, op, mem;
  int stream = 0, ranks = 0, nodes = 0, ppn = 0;
  std::string spec, route, taken;
  uint64_t bytes = 0, count = 0;
  int iters = 0;
  double min_us = 0, median_us = 0, max_us = 0, host_us = 0, algbw = 0, busbw = 0;
  bool valid = false;
  std::string rule = "-";
  int burst = 0;
};

/// The column names in order, joined by ','.
std::string_view bench_csv_header();

/// Parses a whole CSV text; `source` names it in errors ("file:line: reason").
/// Returns false (and the reason in *error) on a missing column or a bad value.
bool parse_bench_csv(std::string_view text, std::string_view source,
                     std::vector<BenchRow>* rows, std::string* error);

/// A row as a Measurement for the table builder (route = row.route, seconds = median).
/// False (and the reason) when the row cannot be one: not valid, spec "table", a
/// collective or memory kind the table does not know, or a taken route that is not the
/// forced one (the route declined: its time is another route's), or a rule column that
/// is not the route as written.
bool to_measurement(const BenchRow& row, Measurement* out, std::string* why);

}  // namespace streamcoll::config
