// Data-parallel training over processes: who this process is, and the collectives the host side
// needs (MPI). Launched with `mpirun -np N ./train ...` or Slurm's `srun ./train ...`; a plain
// `./train` is one process and touches no MPI at all. Built without MPI (no -DUSE_MPI), every
// function here is the one-process case.
//
// Each process trains on its share of every step's micro-batches; the gradients are summed over
// the processes (reduce-scatter: each gets its shard's sum), each updates its shard of the
// parameters (ZeRO-1, config.h's ParamShard) and the shards are gathered back (all-gather). The
// CPU backend does this with the MPI collectives below; the CUDA backend with NCCL on the device
// (llmc/nccl.cuh), MPI only bringing the processes together.
#pragma once
#include <sched.h>
#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>
#include "utils.h"
#ifdef USE_MPI
#define OMPI_SKIP_MPICXX 1  // the C API only
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

struct Dist {
    int rank = 0, world = 1;              // this process among all
    int local_rank = 0, local_world = 1;  // among those on this machine (the GPU it takes)
#ifdef USE_MPI
    MPI_Comm local = MPI_COMM_NULL;  // the processes on this machine
#endif
};

// How many processes the launcher says it started, from its environment (Open MPI's mpirun,
// MPICH's, srun's tasks of this job step); 1 when none did, as for a plain ./train, also inside a
// Slurm allocation of several tasks.
inline int launcher_world_size() {
    for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"}) {
        const char* v = getenv(var);
        if (v && atoi(v) > 1) return atoi(v);
    }
    return 1;
}

#ifdef USE_MPI
inline void mpi_check(int err, const char* what) {
    if (err == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(err, text, &len);
    fail("MPI %s failed: %.*s", what, len, text);
}

inline bool mpi_running() {
    int up = 0, down = 0;
    MPI_Initialized(&up);
    MPI_Finalized(&down);
    return up && !down;
}

inline void stop_every_process() {
    if (mpi_running()) MPI_Abort(MPI_COMM_WORLD, 1);
}

// A count for one MPI call (an int), or a clear stop.
inline int mpi_count(size_t n, const char* what) {
    if (n > (size_t)INT_MAX) fail("MPI %s: %zu elements is more than one call takes (%d)", what, n, INT_MAX);
    return (int)n;
}

// MPI_Init when a launcher started this process, so that a plain ./train needs no MPI runtime.
inline Dist dist_init(int* argc, char*** argv) {
    Dist d;
    int launched = launcher_world_size();
    if (launched == 1) return d;
    int provided = 0;  // the main thread makes every MPI call; OpenMP and the statistics' thread none
    MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);  // errors come back to mpi_check
    MPI_Comm_rank(MPI_COMM_WORLD, &d.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &d.world);
    g_fail_rank = d.rank;
    g_fail_stop_all = stop_every_process;
    if (d.world != launched)
        fail("the launcher started %d processes but MPI sees %d: with srun, use --mpi=pmix (srun --mpi=list shows "
             "what this cluster has)", launched, d.world);
    mpi_check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, d.rank, MPI_INFO_NULL, &d.local), "Comm_split_type");
    MPI_Comm_rank(d.local, &d.local_rank);
    MPI_Comm_size(d.local, &d.local_world);
    return d;
}

// How many processes of this machine may run on the cores this one may, itself included: those
// cores' share of each. (Unbound, every process of the machine; bound to cores of its own, 1.)
inline int dist_local_sharers(const Dist& d) {
    if (d.local_world == 1) return 1;
    cpu_set_t mine;
    CPU_ZERO(&mine);
    if (sched_getaffinity(0, sizeof mine, &mine) != 0) return d.local_world;
    std::vector<cpu_set_t> all(d.local_world);
    mpi_check(MPI_Allgather(&mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE, d.local), "Allgather");
    int sharers = 0;
    for (cpu_set_t& other : all) {
        cpu_set_t both;
        CPU_AND(&both, &mine, &other);
        sharers += CPU_COUNT(&both) > 0;
    }
    return sharers;
}

// The end of a run that went well (or stopped together, every process agreeing).
inline void dist_finalize(const Dist& d) {
    if (d.world > 1 && mpi_running()) MPI_Finalize();
}

inline void dist_barrier(const Dist& d) {
    if (d.world > 1) mpi_check(MPI_Barrier(MPI_COMM_WORLD), "Barrier");
}

// In place: x[i] summed over every process.
inline void dist_sum(const Dist& d, double* x, int n) {
    if (d.world > 1) mpi_check(MPI_Allreduce(MPI_IN_PLACE, x, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD), "Allreduce");
}

inline int dist_max(const Dist& d, int x) {
    if (d.world > 1) mpi_check(MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD), "Allreduce");
    return x;
}

inline int dist_min(const Dist& d, int x) {
    if (d.world > 1) mpi_check(MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD), "Allreduce");
    return x;
}

// In place, on rank 0 only: x[i] summed over every process (the other processes' x is left as
// it was); dist_max_to_root, their maximum.
inline void dist_reduce_to_root(const Dist& d, double* x, size_t n, MPI_Op op) {
    if (d.world == 1) return;
    bool root = d.rank == 0;
    int count = mpi_count(n, "Reduce");
    mpi_check(MPI_Reduce(root ? MPI_IN_PLACE : x, x, count, MPI_DOUBLE, op, 0, MPI_COMM_WORLD), "Reduce");
}
inline void dist_sum_to_root(const Dist& d, double* x, size_t n) { dist_reduce_to_root(d, x, n, MPI_SUM); }
inline void dist_max_to_root(const Dist& d, double* x, size_t n) { dist_reduce_to_root(d, x, n, MPI_MAX); }

// buf holds world shards of `shard` floats: afterwards this process's shard holds the sum over
// every process of that shard (the other shards are left as they were). scratch: shard floats.
inline void dist_reduce_scatter(const Dist& d, float* buf, float* scratch, size_t shard) {
    if (d.world == 1) return;
    int n = mpi_count(shard, "Reduce_scatter_block");
    mpi_check(MPI_Reduce_scatter_block(buf, scratch, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD), "Reduce_scatter_block");
    std::copy(scratch, scratch + shard, buf + (size_t)d.rank * shard);
}

// buf holds world shards of `shard` floats: afterwards every shard is its owner's everywhere.
inline void dist_all_gather(const Dist& d, float* buf, size_t shard) {
    if (d.world == 1) return;
    int n = mpi_count(shard, "Allgather");
    mpi_check(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, n, MPI_FLOAT, MPI_COMM_WORLD), "Allgather");
}

// As dist_all_gather, but only rank 0 receives (a checkpoint's optimiser state).
inline void dist_gather_to_root(const Dist& d, float* buf, size_t shard) {
    if (d.world == 1) return;
    bool root = d.rank == 0;
    const void* send = root ? MPI_IN_PLACE : buf + (size_t)d.rank * shard;
    int n = mpi_count(shard, "Gather");
    mpi_check(MPI_Gather(send, n, MPI_FLOAT, buf, n, MPI_FLOAT, 0, MPI_COMM_WORLD), "Gather");
}
#else
inline Dist dist_init(int*, char***) {
    int launched = launcher_world_size();
    if (launched > 1)
        fail("the launcher started %d processes, but this ./train was built without MPI (install libopenmpi-dev and "
             "run make again)", launched);
    return Dist();
}
inline void dist_finalize(const Dist&) {}
inline int dist_local_sharers(const Dist&) { return 1; }
inline void dist_barrier(const Dist&) {}
inline void dist_sum(const Dist&, double*, int) {}
inline int dist_max(const Dist&, int x) { return x; }
inline int dist_min(const Dist&, int x) { return x; }
inline void dist_sum_to_root(const Dist&, double*, size_t) {}
inline void dist_max_to_root(const Dist&, double*, size_t) {}
inline void dist_reduce_scatter(const Dist&, float*, float*, size_t) {}
inline void dist_all_gather(const Dist&, float*, size_t) {}
inline void dist_gather_to_root(const Dist&, float*, size_t) {}
#endif

// A failure every process reached together (a step's loss is the same on all): once each has
// arrived, so that rank 0 has closed what it writes, rank 0 says why and every process ends.
[[noreturn]] inline void dist_fail_together(const Dist& d, const std::string& why) {
    dist_barrier(d);
    if (d.rank == 0) fprintf(stderr, "error: %s\n", why.c_str());
    fflush(stderr);
    dist_finalize(d);
    exit(1);
}
