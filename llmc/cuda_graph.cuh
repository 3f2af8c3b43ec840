// Passes replayed from CUDA graphs (./train's unless TRAIN_CUDA_GRAPH=0 turns them off).
// A training micro-batch queues some 700 kernels at d22 (a layer's forward about 10, its backward
// about 20), always the same ones, with the same arguments and buffers. Launched one by one, each
// costs the host a few microseconds and the device a short gap while it takes the next launch
// from the stream; a graph (cudaStreamBeginCapture ... cudaStreamEndCapture, then cudaGraphLaunch)
// hands the device the whole sequence in one launch. The kernels are the same, with the same
// arguments, in the same order: a replay is meant to give the bits of the direct run
// (test_gpt_cuda checks that on a GPU; on an H200 at d22, 8 x 2048, graphs took 0.5 ms off a step
// of 31.5, with the same losses and norms bit for bit).
//
// A pass is identified by a key that fixes everything its kernels' arguments depend on (the
// caller's: the batch shape, the loss scale, the workspaces' generation). Its first run is direct:
// it may make plans, tune algorithms and allocate workspaces, which a capture cannot hold. Its
// second run is captured and launched, and later runs launch the graph alone. A call inside the
// pass that a capture refuses fails as it would anywhere (its check names it, and the run ends);
// a capture that ends in an error (cudaStreamEndCapture or the graph's instantiation refusing it)
// leaves the pass to run directly, and every pass from then on; the end of a run says so.
#pragma once
#include <string>
#include <vector>
#include "cuda_common.cuh"

struct PassKey {
    int pass = 0, B = 0, T = 0;  // which pass (the caller's numbering) and the micro-batch's shape
    float scale = 0.0f;          // the backward's loss scale
    int generation = 0;          // bumped whenever a buffer the pass uses moves (cuDNN's workspace)
    bool operator==(const PassKey& o) const {
        return pass == o.pass && B == o.B && T == o.T && scale == o.scale && generation == o.generation;
    }
};

struct PassGraphs {
    bool on = false;
    struct Entry {
        PassKey key;
        long long runs = 0;
        cudaGraphExec_t exec = nullptr;
    };
    std::vector<Entry> entries;
    std::string refused;  // why a capture failed (every pass runs directly since)
};

// Unless TRAIN_CUDA_GRAPH=0 in the environment.
inline bool pass_graphs_wanted() {
    const char* v = getenv("TRAIN_CUDA_GRAPH");
    return !(v && std::string(v) == "0");
}

// Runs work() on stream s, directly or through the pass's graph (see the top of the file). work()
// must only queue work on s, or on other streams forked from s (they wait on an event recorded on
// s) and joined back into s before it returns: no synchronisation, no allocation, no host read of
// what it computes.
template <typename Work>
void pass_graph_run(PassGraphs& pg, const PassKey& key, cudaStream_t s, Work&& work) {
    if (!pg.on) {
        work();
        return;
    }
    PassGraphs::Entry* e = nullptr;
    for (PassGraphs::Entry& x : pg.entries)
        if (x.key == key) e = &x;
    if (!e) {
        pg.entries.push_back({key});
        e = &pg.entries.back();
    }
    if (e->runs++ == 0) {
        work();
        return;
    }
    if (!e->exec) {
        // Thread-local: a call of this thread that a graph cannot hold fails the capture; other
        // threads (the statistics' host work) are left alone.
        cudaCheck(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        work();
        cudaGraph_t graph = nullptr;
        cudaError_t err = cudaStreamEndCapture(s, &graph);
        // A kernel node keeps the priority of the stream it was captured from (the statistics' second
        // stream is below the model's, StatsBeside) only when the graph is made to honour it.
        const unsigned long long flags = kCandidateKernels ? cudaGraphInstantiateFlagUseNodePriority : 0;
        if (err == cudaSuccess) err = cudaGraphInstantiateWithFlags(&e->exec, graph, flags);
        if (graph) cudaCheck(cudaGraphDestroy(graph));
        if (err != cudaSuccess) {
            cudaGetLastError();  // the capture's error is not sticky: clear it
            e->exec = nullptr;
            pg.on = false;
            pg.refused = cudaGetErrorString(err);
            work();  // nothing ran while it was being captured
            return;
        }
    }
    cudaCheck(cudaGraphLaunch(e->exec, s));
}

// What the graphs did, for the end of a run (nothing when not asked for).
inline void pass_graphs_print(const PassGraphs& pg) {
    if (pg.entries.empty() || g_fail_rank > 0) return;
    long long replays = 0;
    int captured = 0;
    for (const PassGraphs::Entry& e : pg.entries)
        if (e.exec) {
            captured++;
            replays += e.runs - 1;
        }
    if (!pg.refused.empty())
        printf("CUDA graphs: a capture failed (%s); the passes ran directly\n", pg.refused.c_str());
    else
        printf("CUDA graphs: %d passes captured, %lld runs from them\n", captured, replays);
}

inline void pass_graphs_free(PassGraphs& pg) {
    for (PassGraphs::Entry& e : pg.entries)
        if (e.exec) cudaCheck(cudaGraphExecDestroy(e.exec));
    pg = PassGraphs();
}
