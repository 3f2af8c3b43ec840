// The CUDA backend's collectives between the processes of a data-parallel run (distributed.h):
// NCCL on the model's stream, one communicator over every process, brought up through MPI.
//
// Built with -DUSE_NCCL (the Makefile sets it when nccl.h is found). The library itself is opened
// (dlopen) only when a run needs it, as the loader finds it or else from PyTorch's (its wheels'
// nvidia/nccl/lib, a conda environment's lib; dynamic_library.h), so a ./train built with NCCL support still runs on one GPU
// where no libnccl is installed. One process can take this path too, a communicator of one GPU,
// with TRAIN_NCCL=1 in its environment: on a machine with a single GPU that checks the NCCL path
// against the plain one (NCCL refuses two processes on one GPU).
#pragma once
#include "cuda_common.cuh"
#include "distributed.h"
#ifdef USE_NCCL
#include <nccl.h>
#include "dynamic_library.h"

// The functions used, looked up in libnccl.so.2 when first needed.
struct NcclApi {
    decltype(&ncclGetUniqueId) get_unique_id;
    decltype(&ncclCommInitRank) comm_init_rank;
    decltype(&ncclCommDestroy) comm_destroy;
    decltype(&ncclReduceScatter) reduce_scatter;
    decltype(&ncclAllGather) all_gather;
    decltype(&ncclAllReduce) all_reduce;
    decltype(&ncclGetErrorString) error_string;
};

inline const NcclApi& nccl_api() {
    static NcclApi api = [] {
        std::string from, why;
        void* lib = load_library("libnccl.so.2", "nccl", &from, &why);
        if (!lib) fail("NCCL: %s", why.c_str());
        if (!from.empty() && g_fail_rank <= 0) printf("NCCL: loaded from %s\n", from.c_str());
        auto find = [lib](const char* name) {
            void* f = dlsym(lib, name);
            if (!f) fail("NCCL: libnccl.so.2 has no %s (%s); install NCCL 2.12 or later", name, dlerror());
            return f;
        };
        NcclApi a;
        a.get_unique_id = (decltype(a.get_unique_id))find("ncclGetUniqueId");
        a.comm_init_rank = (decltype(a.comm_init_rank))find("ncclCommInitRank");
        a.comm_destroy = (decltype(a.comm_destroy))find("ncclCommDestroy");
        a.reduce_scatter = (decltype(a.reduce_scatter))find("ncclReduceScatter");
        a.all_gather = (decltype(a.all_gather))find("ncclAllGather");
        a.all_reduce = (decltype(a.all_reduce))find("ncclAllReduce");
        a.error_string = (decltype(a.error_string))find("ncclGetErrorString");
        return a;
    }();
    return api;
}

inline void nccl_check(ncclResult_t r, const char* what) {
    if (r != ncclSuccess) fail("NCCL %s failed: %s", what, nccl_api().error_string(r));
}

struct Nccl {
    ncclComm_t comm = nullptr;
};

// Rank 0 makes the communicator's id, MPI hands it to every process, each joins with its rank.
inline void nccl_init(Nccl& n, const Dist& d) {
    ncclUniqueId id;
    if (d.rank == 0) nccl_check(nccl_api().get_unique_id(&id), "GetUniqueId");
#ifdef USE_MPI
    if (d.world > 1) mpi_check(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD), "Bcast");
#endif
    nccl_check(nccl_api().comm_init_rank(&n.comm, d.world, id, d.rank), "CommInitRank");
}

inline void nccl_free(Nccl& n) {
    if (n.comm) nccl_check(nccl_api().comm_destroy(n.comm), "CommDestroy");
    n.comm = nullptr;
}

// buf holds world shards of `shard` floats; this process's shard gets the sum over every process.
inline void nccl_reduce_scatter(Nccl& n, float* buf, size_t shard, int rank, cudaStream_t s) {
    nccl_check(nccl_api().reduce_scatter(buf, buf + (size_t)rank * shard, shard, ncclFloat, ncclSum, n.comm, s), "ReduceScatter");
}

// buf holds world shards of `shard` floats; every process gets every owner's shard.
inline void nccl_all_gather(Nccl& n, float* buf, size_t shard, int rank, cudaStream_t s) {
    nccl_check(nccl_api().all_gather(buf + (size_t)rank * shard, buf, shard, ncclFloat, n.comm, s), "AllGather");
}

// In place, x[0..count) summed over every process.
inline void nccl_sum(Nccl& n, double* x, size_t count, cudaStream_t s) {
    nccl_check(nccl_api().all_reduce(x, x, count, ncclDouble, ncclSum, n.comm, s), "AllReduce");
}
#else
struct Nccl {};
inline void nccl_init(Nccl&, const Dist& d) {
    fail("this ./train was built without NCCL: %d GPU process%s cannot take the data-parallel path (install NCCL's "
         "headers, libnccl-dev, and run make again)", d.world, d.world > 1 ? "es" : "");
}
inline void nccl_free(Nccl&) {}
inline void nccl_reduce_scatter(Nccl&, float*, size_t, int, cudaStream_t) {}
inline void nccl_all_gather(Nccl&, float*, size_t, int, cudaStream_t) {}
inline void nccl_sum(Nccl&, double*, size_t, cudaStream_t) {}
#endif

// Whether this process's GPU model takes the NCCL path: in a run of several processes, or when
// TRAIN_NCCL=1 asks one process to.
inline bool nccl_wanted(const Dist& d) {
    const char* v = getenv("TRAIN_NCCL");
    return d.world > 1 || (v && std::string(v) == "1");
}
