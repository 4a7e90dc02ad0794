// Route blueconnect on host buffers, with imposed hierarchies, against the MPI's own
// collective, in one run: MPI_Allreduce(MPI_FLOAT, MPI_SUM) from 4 B to 16 MiB
// (x4 steps), and briefly MPI_Reduce_scatter_block and MPI_Allgather (--coll).
//
//   hier_latency [--coll allreduce|reduce_scatter_block|allgather|all (or a comma list)]
//                [--min 4] [--max 16M] [--iters 100] [--min-iters 5] [--warmup 3]
//                [--hier LIST] [--ht LIST] [--csv [FILE]]
//
// Variants (columns), each a duplicate of MPI_COMM_WORLD:
//   mpi         no route set: the call goes to the MPI (pmpi); the reference
//   bc HIER     streamcoll_comm_set_route(dup, "*:blueconnect:hierarchy=HIER:backend=sched")
//   bc HIER/B   ... :backend=B (B: sched, mpi, or one per level innermost first: sched/mpi)
//   ht ALGO     streamcoll_comm_set_route(dup, "*:ht:algo=ALGO"): a flat host algorithm
// --hier LIST: comma-separated; each item HIER[:BACKEND][:ring] (2x4, 2x4:mpi,
//   2x2x2:sched/mpi/sched, 2x4:sched:ring) or raw route parameters (hierarchy=2x4:algo=ring).
//   Default: every 2-level factorization AxB of the world size (A, B >= 2), the 3-level
//   one with the smallest inner factors when there is one, all with backend=sched, then
//   the first 2-level one again with backend=mpi. "none": no blueconnect column.
// --ht LIST: ht algorithms (rd, rabenseifner, ring, mpi); default rabenseifner,ring; "none".
//
// Sizes are the bytes of the whole vector: the allreduce vector, the reduce-scatter input
// (count per rank = bytes / 4 / ranks), the all-gather output; sizes that give less than
// one float per rank are skipped. Iterations per size: --iters up to 64 KiB, then scaled
// down by the size (never below --min-iters).
//
// Method: per size, every variant's first call is checked (receive buffer poisoned with
// NaN; the inputs are small integers in floats, so every sum is exact and must match the
// host's bit for bit) and, when STREAMCOLL_STATS=1, its route is checked with
// streamcoll_get_stats (mpi must run on pmpi, bc on blueconnect, ht on ht: a route that
// declines is a failure, not a silent pmpi column). Then --warmup - 1 more calls each, then
// the timed rounds: in round r the variants run in turn, starting at variant r mod V, each
// call after a PMPI_Barrier, so machine noise hits them alike. A call's time is the
// largest over the ranks (from the barrier's exit to the call's return on each rank).
// Reported per size and variant: median and min over the rounds (microseconds), and the
// ratio variant median / mpi median (below 1: faster than the MPI).
// Output: a readable table per collective (latencies, then the ratios and the best
// blueconnect variant per size); with --csv the lines
//   coll,ranks,bytes,variant,spec,iters,median_us,min_us,ratio
// on stdout instead of the tables, with --csv FILE (a next argument not starting with "--")
// the tables on stdout and the lines in FILE.
// A wrong result or route prints "FAIL: ..." and exits 1 (after the table).
// Needs streamcoll loaded (LD_PRELOAD; scripts/bench-bc.sh); exits 2 without it.
#include <dlfcn.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "streamcoll/streamcoll.h"

namespace {

using GetStats = int (*)(const char*, const char*, const char*, streamcoll_stat_t*);
using SetRoute = int (*)(MPI_Comm, const char*);
using Version = const char* (*)();

enum class Coll { allreduce, reduce_scatter_block, allgather };
const char* coll_name(Coll c) {
  switch (c) {
    case Coll::allreduce: return "allreduce";
    case Coll::reduce_scatter_block: return "reduce_scatter_block";
    case Coll::allgather: return "allgather";
  }
  return "?";
}

struct Options {
  std::vector<Coll> colls{Coll::allreduce};
  uint64_t min_bytes = 4, max_bytes = 16u << 20;
  int iters = 100, min_iters = 5, warmup = 3;
  std::string hier = "default", ht = "rabenseifner,ring";
  bool csv = false;     // CSV on stdout instead of the tables
  std::string csv_file; // CSV into this file as well as the tables
};

struct Variant {
  std::string label;  // column heading
  std::string spec;   // streamcoll_comm_set_route spec; empty: no route (the MPI)
  const char* route;  // the route its calls must take (statistics)
  MPI_Comm comm = MPI_COMM_NULL;
};

struct Result {
  double median = 0, min = 0;
};

struct Row {  // one size: a Result per variant
  uint64_t bytes;
  int iters;
  std::vector<Result> res;
};

uint64_t parse_bytes(const char* s) {
  char* end = nullptr;
  uint64_t v = std::strtoull(s, &end, 10);
  if (*end == 'K' || *end == 'k') v <<= 10;
  if (*end == 'M' || *end == 'm') v <<= 20;
  return v;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i)
    if (i == s.size() || s[i] == sep) {
      if (i > start) out.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  return out;
}

std::string join(const std::vector<int>& f) {
  std::string s;
  for (int x : f) s += (s.empty() ? "" : "x") + std::to_string(x);
  return s;
}

// The default hierarchies: every AxB = p (A, B >= 2), then one AxBxC with the smallest
// inner factors.
std::vector<std::string> default_hierarchies(int p, std::string* first2) {
  std::vector<std::string> out;
  for (int a = 2; a <= p / 2; ++a)
    if (p % a == 0 && p / a >= 2) out.push_back(join({a, p / a}));
  *first2 = out.empty() ? "" : out.front();
  for (int a = 2; a <= p; ++a) {
    if (p % a) continue;
    const int q = p / a;
    for (int b = 2; b <= q / 2; ++b)
      if (q % b == 0 && q / b >= 2) {
        out.push_back(join({a, b, q / b}));
        return out;
      }
  }
  return out;
}

// One --hier item -> (label, route parameters).
bool bc_variant(const std::string& item, Variant* v) {
  if (item.find('=') != std::string::npos) {
    std::string short_label;  // the values only: hierarchy=2x4:backend=mpi -> 2x4:mpi
    for (const std::string& kv : split(item, ':')) {
      const size_t eq = kv.find('=');
      short_label += (short_label.empty() ? "" : ":") + (eq == std::string::npos ? kv : kv.substr(eq + 1));
    }
    v->label = "bc " + short_label;
    v->spec = "*:blueconnect:" + item;
  } else {
    auto parts = split(item, ':');
    if (parts.empty()) return false;
    std::string backend = "sched", algo;
    for (size_t i = 1; i < parts.size(); ++i) {
      if (parts[i] == "ring" || parts[i] == "auto") algo = parts[i];
      else backend = parts[i];
    }
    v->label = "bc " + parts[0] + (backend == "sched" ? "" : "/" + backend) +
               (algo == "ring" ? "+ring" : "");
    v->spec = "*:blueconnect:hierarchy=" + parts[0] + ":backend=" + backend +
              (algo.empty() ? "" : ":algo=" + algo);
  }
  v->route = "blueconnect";
  return true;
}

// Small integers, different per rank and element: every sum over <= 2^16 ranks is exact.
inline float input(uint64_t i, int rank) {
  return static_cast<float>((i * 7 + static_cast<uint64_t>(rank) * 13) % 31);
}

struct Bench {
  Options opt;
  int rank = 0, size = 1;
  GetStats get = nullptr;
  SetRoute set_route = nullptr;
  bool stats_on = false;
  std::vector<Variant> vars;
  std::vector<float> send, recv, want;
  int failed = 0;
  bool printed_header = false;
  FILE* csv_out = nullptr;  // rank 0: where the CSV lines go (stdout or --csv FILE)

  void fail(const std::string& why) {
    if (rank == 0 || !failed) std::printf("FAIL: rank %d: %s\n", rank, why.c_str());  // others: once
    std::fflush(stdout);
    failed = 1;
  }

  int call(Coll c, MPI_Comm comm, int count) {
    switch (c) {
      case Coll::allreduce:
        return MPI_Allreduce(send.data(), recv.data(), count, MPI_FLOAT, MPI_SUM, comm);
      case Coll::reduce_scatter_block:
        return MPI_Reduce_scatter_block(send.data(), recv.data(), count, MPI_FLOAT, MPI_SUM, comm);
      case Coll::allgather:
        return MPI_Allgather(send.data(), count, MPI_FLOAT, recv.data(), count, MPI_FLOAT, comm);
    }
    return MPI_ERR_OTHER;
  }

  // Inputs and expected outputs for one size; count as the call takes it.
  // Returns the number of output elements to check.
  size_t prepare(Coll c, int count) {
    const uint64_t n = static_cast<uint64_t>(count);
    const uint64_t p = static_cast<uint64_t>(size);
    switch (c) {
      case Coll::allreduce:
        for (uint64_t i = 0; i < n; ++i) {
          send[i] = input(i, rank);
          float s = 0;
          for (int r = 0; r < size; ++r) s += input(i, r);
          want[i] = s;
        }
        return n;
      case Coll::reduce_scatter_block:
        for (uint64_t i = 0; i < n * p; ++i) send[i] = input(i, rank);
        for (uint64_t i = 0; i < n; ++i) {
          float s = 0;
          for (int r = 0; r < size; ++r) s += input(static_cast<uint64_t>(rank) * n + i, r);
          want[i] = s;
        }
        return n;
      case Coll::allgather:
        for (uint64_t i = 0; i < n; ++i) send[i] = input(i, rank);
        for (uint64_t r = 0; r < p; ++r)
          for (uint64_t i = 0; i < n; ++i) want[r * n + i] = input(i, static_cast<int>(r));
        return n * p;
    }
    return 0;
  }

  unsigned long long route_calls(Coll c, const char* route) {
    streamcoll_stat_t st{};
    if (!get || get(coll_name(c), route, "host", &st) != 0) return 0;
    return st.calls;
  }

  // The first call of variant v at this size: poisoned output, exact check, route check.
  void first_call(Coll c, Variant& v, int count, size_t check_n, uint64_t bytes) {
    std::fill(recv.begin(), recv.begin() + static_cast<long>(check_n), std::nanf(""));
    const unsigned long long before = stats_on ? route_calls(c, v.route) : 0;
    PMPI_Barrier(MPI_COMM_WORLD);
    int rc = call(c, v.comm, count);
    const std::string what = std::string(coll_name(c)) + " " + std::to_string(bytes) + " B, " +
                             v.label + " (" + (v.spec.empty() ? "no route" : v.spec) + ")";
    if (rc != MPI_SUCCESS) fail(what + ": returned " + std::to_string(rc));
    for (size_t i = 0; i < check_n; ++i)
      if (!(recv[i] == want[i])) {
        fail("WRONG RESULT: " + what + ": element " + std::to_string(i) + " is " +
             std::to_string(recv[i]) + ", expected " + std::to_string(want[i]));
        break;
      }
    if (stats_on) {
      const unsigned long long after = route_calls(c, v.route);
      if (after != before + 1)
        fail("WRONG ROUTE: " + what + ": the call did not run on route " + v.route +
             " (streamcoll_get_stats)");
    }
  }

  void run(Coll c) {
    const int V = static_cast<int>(vars.size());
    std::vector<uint64_t> sizes;
    for (uint64_t b = opt.min_bytes; b <= opt.max_bytes; b *= 4) sizes.push_back(b);
    if (!opt.csv && rank == 0)
      std::printf("\n## %s (MPI_FLOAT%s, host buffers), %d ranks\n", coll_name(c),
                  c == Coll::allgather ? "" : ", MPI_SUM", size);

    std::vector<Row> rows;  // rank 0
    uint64_t last_bytes = 0;
    for (uint64_t want_bytes : sizes) {
      int count;  // the call's count argument
      uint64_t bytes;
      if (c == Coll::allreduce) {
        count = static_cast<int>(std::max<uint64_t>(1, want_bytes / 4));
        bytes = static_cast<uint64_t>(count) * 4;
      } else {
        count = static_cast<int>(want_bytes / 4 / static_cast<uint64_t>(size));
        if (count == 0) continue;
        bytes = static_cast<uint64_t>(count) * 4 * static_cast<uint64_t>(size);
      }
      if (bytes == last_bytes) continue;  // --min below one float
      last_bytes = bytes;
      const int iters = std::max(
          opt.min_iters,
          static_cast<int>(opt.iters * (bytes <= 65536 ? 1.0 : 65536.0 / static_cast<double>(bytes))));
      const size_t check_n = prepare(c, count);

      for (int k = 0; k < V; ++k) first_call(c, vars[static_cast<size_t>(k)], count, check_n, bytes);
      for (int w = 1; w < opt.warmup; ++w)
        for (int k = 0; k < V; ++k) {
          PMPI_Barrier(MPI_COMM_WORLD);
          call(c, vars[static_cast<size_t>((k + w) % V)].comm, count);
        }
      // t[v * iters + r]: this rank's time of variant v in round r.
      std::vector<double> t(static_cast<size_t>(V) * static_cast<size_t>(iters)), tmax(t.size());
      for (int r = 0; r < iters; ++r)
        for (int k = 0; k < V; ++k) {
          const int v = (k + r) % V;
          PMPI_Barrier(MPI_COMM_WORLD);
          const double t0 = MPI_Wtime();
          call(c, vars[static_cast<size_t>(v)].comm, count);
          t[static_cast<size_t>(v) * static_cast<size_t>(iters) + static_cast<size_t>(r)] =
              (MPI_Wtime() - t0) * 1e6;
        }
      PMPI_Reduce(t.data(), tmax.data(), static_cast<int>(t.size()), MPI_DOUBLE, MPI_MAX, 0,
                  MPI_COMM_WORLD);
      Row row{bytes, iters, {}};
      for (int v = 0; v < V; ++v) {
        std::vector<double> s(tmax.begin() + static_cast<long>(v) * iters,
                              tmax.begin() + static_cast<long>(v + 1) * iters);
        std::sort(s.begin(), s.end());
        const size_t m = s.size();
        row.res.push_back({m % 2 ? s[m / 2] : 0.5 * (s[m / 2 - 1] + s[m / 2]), s.front()});
      }
      int ok = !failed, all_ok = 0;
      PMPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
      if (!all_ok) failed = 1;
      if (rank == 0) {
        print_row(c, row.bytes, row.iters, row.res);
        rows.push_back(row);
      }
    }
    if (rank == 0 && !opt.csv) print_ratios(rows);
  }

  // A table column: at least `least` characters, and as wide as the longest label.
  int width(int least) const {
    int w = least;
    for (const Variant& v : vars) w = std::max(w, static_cast<int>(v.label.size()));
    return w;
  }

  void print_row(Coll c, uint64_t bytes, int iters, const std::vector<Result>& res) {
    const double ref = res[0].median;
    if (csv_out) {
      for (size_t v = 0; v < vars.size(); ++v)
        std::fprintf(csv_out, "%s,%d,%llu,%s,%s,%d,%.3f,%.3f,%.4f\n", coll_name(c), size,
                     static_cast<unsigned long long>(bytes), vars[v].label.c_str(),
                     vars[v].spec.empty() ? "-" : vars[v].spec.c_str(), iters, res[v].median,
                     res[v].min, res[v].median / ref);
      std::fflush(csv_out);
    }
    if (opt.csv) return;
    if (!printed_header) {
      std::printf("# latency in microseconds: median [min] over the rounds\n%10s %5s", "bytes",
                  "iters");
      for (const Variant& v : vars) std::printf(" %*s", width(20), v.label.c_str());
      std::printf("\n");
      printed_header = true;
    }
    std::printf("%10llu %5d", static_cast<unsigned long long>(bytes), iters);
    for (const Result& r : res) {
      char cell[64];
      std::snprintf(cell, sizeof cell, "%.1f [%.1f]", r.median, r.min);
      std::printf(" %*s", width(20), cell);
    }
    std::printf("\n");
    std::fflush(stdout);
  }

  void print_ratios(const std::vector<Row>& rows) {
    printed_header = false;
    std::printf("# ratio variant/mpi of the medians (< 1: faster than the MPI's own)\n%10s",
                "bytes");
    const int w = width(13);
    for (size_t v = 1; v < vars.size(); ++v) std::printf(" %*s", w, vars[v].label.c_str());
    std::printf(" %*s %13s\n", w, "best bc", "best bc/mpi");
    for (const Row& row : rows) {
      const std::vector<Result>* res = &row.res;
      const double ref = (*res)[0].median;
      std::printf("%10llu", static_cast<unsigned long long>(row.bytes));
      size_t best = 0;
      for (size_t v = 1; v < vars.size(); ++v) {
        std::printf(" %*.3f", w, (*res)[v].median / ref);
        if (vars[v].route == std::string("blueconnect") &&
            (best == 0 || (*res)[v].median < (*res)[best].median))
          best = v;
      }
      if (best)
        std::printf(" %*s %13.3f\n", w, vars[best].label.c_str(), (*res)[best].median / ref);
      else
        std::printf(" %*s %13s\n", w, "-", "-");
    }
    std::fflush(stdout);
  }
};

void usage() {
  std::fprintf(stderr,
               "usage: hier_latency [--coll allreduce|reduce_scatter_block|allgather|all] "
               "[--min 4] [--max 16M] [--iters 100] [--min-iters 5] [--warmup 3] "
               "[--hier LIST|none] [--ht LIST|none] [--csv [FILE]]\n");
}

}  // namespace

int main(int argc, char** argv) {
  // Routes with a progress thread (ht, blueconnect) need MPI_THREAD_MULTIPLE, which the
  // table cannot show streamcoll at MPI_Init when they are forced per communicator.
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  Bench b;
  MPI_Comm_rank(MPI_COMM_WORLD, &b.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &b.size);
  Options& opt = b.opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has = i + 1 < argc;
    if (a == "--csv") {
      if (has && std::strncmp(argv[i + 1], "--", 2) != 0) opt.csv_file = argv[++i];
      else opt.csv = true;
    } else if (a == "--coll" && has) {
      opt.colls.clear();
      for (const std::string& c : split(argv[++i], ',')) {
        if (c == "allreduce" || c == "all") opt.colls.push_back(Coll::allreduce);
        if (c == "reduce_scatter_block" || c == "rsb" || c == "all")
          opt.colls.push_back(Coll::reduce_scatter_block);
        if (c == "allgather" || c == "all") opt.colls.push_back(Coll::allgather);
      }
    } else if (a == "--min" && has) {
      opt.min_bytes = std::max<uint64_t>(1, parse_bytes(argv[++i]));
    } else if (a == "--max" && has) {
      opt.max_bytes = parse_bytes(argv[++i]);
    } else if (a == "--iters" && has) {
      opt.iters = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--min-iters" && has) {
      opt.min_iters = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--warmup" && has) {
      opt.warmup = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--hier" && has) {
      opt.hier = argv[++i];
    } else if (a == "--ht" && has) {
      opt.ht = argv[++i];
    } else {
      if (b.rank == 0) {
        std::fprintf(stderr, "hier_latency: unknown or incomplete option '%s'\n", a.c_str());
        usage();
      }
      MPI_Finalize();
      return 2;
    }
  }
  if (opt.colls.empty()) {
    if (b.rank == 0) usage();
    MPI_Finalize();
    return 2;
  }

  b.get = reinterpret_cast<GetStats>(dlsym(RTLD_DEFAULT, "streamcoll_get_stats"));
  b.set_route = reinterpret_cast<SetRoute>(dlsym(RTLD_DEFAULT, "streamcoll_comm_set_route"));
  auto version = reinterpret_cast<Version>(dlsym(RTLD_DEFAULT, "streamcoll_version"));
  if (!b.set_route) {
    if (b.rank == 0)
      std::printf("hier_latency: streamcoll is not loaded (no streamcoll_comm_set_route): run "
                  "it with LD_PRELOAD=libstreamcoll.so (scripts/bench-bc.sh)\n");
    MPI_Finalize();
    return 2;
  }

  // The variants.
  b.vars.push_back({"mpi", "", "pmpi"});
  if (opt.hier != "none") {
    std::vector<std::string> items;
    if (opt.hier == "default") {
      std::string first2;
      items = default_hierarchies(b.size, &first2);
      if (!first2.empty()) items.push_back(first2 + ":mpi");
    } else {
      items = split(opt.hier, ',');
    }
    for (const std::string& item : items) {
      Variant v;
      if (!bc_variant(item, &v)) continue;
      b.vars.push_back(v);
    }
  }
  if (opt.ht != "none")
    for (const std::string& algo : split(opt.ht, ','))
      b.vars.push_back({"ht " + algo, "*:ht:algo=" + algo, "ht"});

  for (Variant& v : b.vars) {
    PMPI_Comm_dup(MPI_COMM_WORLD, &v.comm);
    if (!v.spec.empty()) {
      const int rc = b.set_route(v.comm, v.spec.c_str());
      if (rc != MPI_SUCCESS) {
        if (b.rank == 0)
          std::printf("FAIL: streamcoll_comm_set_route(\"%s\") returned %d\n", v.spec.c_str(), rc);
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
    }
  }

  // Statistics on? One call on the unrouted duplicate must count.
  if (b.get) {
    streamcoll_stat_t s0{}, s1{};
    b.get(nullptr, nullptr, nullptr, &s0);
    int x = 1, y = 0;
    MPI_Allreduce(&x, &y, 1, MPI_INT, MPI_SUM, b.vars[0].comm);
    b.get(nullptr, nullptr, nullptr, &s1);
    b.stats_on = s1.calls > s0.calls;
  }

  uint64_t max_elems = std::max<uint64_t>(1, opt.max_bytes / 4) + static_cast<uint64_t>(b.size);
  b.send.assign(max_elems, 0.0f);
  b.recv.assign(max_elems, 0.0f);
  b.want.assign(max_elems, 0.0f);

  if (b.rank == 0) {
    std::printf("# hier_latency: %d ranks, streamcoll %s, sizes %llu B .. %llu B (x4), "
                "--iters %d (scaled down above 64 KiB, at least %d), --warmup %d; "
                "route check: %s\n",
                b.size, version ? version() : "?", static_cast<unsigned long long>(opt.min_bytes),
                static_cast<unsigned long long>(opt.max_bytes), opt.iters, opt.min_iters,
                opt.warmup, b.stats_on ? "on (streamcoll_get_stats)" : "OFF (STREAMCOLL_STATS unset)");
    std::printf("# a call's time: max over ranks, barrier exit to return; variants interleaved "
                "per round (rotating start)\n");
    for (const Variant& v : b.vars)
      std::printf("#   %-16s %s\n", v.label.c_str(),
                  v.spec.empty() ? "no route: MPI_Allreduce etc. go to the MPI (pmpi)"
                                 : v.spec.c_str());
    if (opt.csv) {
      b.csv_out = stdout;
    } else if (!opt.csv_file.empty() && !(b.csv_out = std::fopen(opt.csv_file.c_str(), "w"))) {
      std::printf("hier_latency: cannot write %s\n", opt.csv_file.c_str());
    }
    if (b.csv_out) std::fprintf(b.csv_out, "coll,ranks,bytes,variant,spec,iters,median_us,min_us,ratio\n");
    std::fflush(stdout);
  }

  for (Coll c : opt.colls) {
    b.printed_header = false;
    b.run(c);
  }

  for (Variant& v : b.vars) PMPI_Comm_free(&v.comm);
  if (b.csv_out && b.csv_out != stdout) std::fclose(b.csv_out);
  int ok = !b.failed, all_ok = 0;
  PMPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (b.rank == 0)
    std::printf("%s\n", !all_ok ? "FAIL: see the lines above"
                         : b.stats_on ? "# every first call checked: results exact, routes as asked"
                                      : "# every first call checked: results exact (routes NOT "
                                        "checked: STREAMCOLL_STATS=1 is needed)");
  MPI_Finalize();
  return all_ok ? 0 : 1;
}
