// The run folder (-o DIR): one live run owns it, a new run never takes over another's, a resumed
// run only appends to the log of its own run and only from a checkpoint on the line that log
// records, and --keep never deletes the checkpoint a resume needs. Here: the run as its folder
// knows it (RunFolder), taking the folder, opening its log, and the folder's checkpoints.
//
//   DIR/run.attnlog              the run log (runlog.h)
//   DIR/model.ckpt               the final checkpoint (checkpoint.h)
//   DIR/model_stepNNNNNN.ckpt    every -n steps
//   DIR/run-<UTC>.attnlog        the log of a run killed before its first checkpoint, set aside
#pragma once
#include <fcntl.h>
#include <sys/file.h>
#include <sys/random.h>
#include <cctype>
#include <algorithm>
#include <string>
#include <vector>
#include "checkpoint.h"
#include "dataprep.h"
#include "hf_checkpoint.h"
#include "options.h"
#include "runlog.h"
#include "runlog_append.h"
#include "utils.h"

// A random 64-bit id, never 0 (0 means "none"): a run's, or a continuation's.
inline uint64_t new_run_id() {
    uint64_t id = 0;
    while (id == 0)
        if (getrandom(&id, sizeof id, 0) != (ssize_t)sizeof id) id = (uint64_t)now_seconds() * 0x9E3779B97F4A7C15ull ^ (uint64_t)getpid();
    return id;
}

// Takes the folder for this process until it ends (the kernel drops the lock with the process,
// however it dies): a second ./train into the same folder stops here. On a file system without
// locks the run goes on unlocked.
inline void lock_run_dir(const std::string& dir) {
    int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) fail("%s: cannot open the output directory (%s)", dir.c_str(), strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        if (errno == EWOULDBLOCK)
            fail("%s: another ./train is running into this directory; wait for it to end, or choose another output "
                 "directory (%s)", dir.c_str(), OPTION_NAME("--out"));
        close(fd);
    }
    // fd stays open (and locked) for the rest of the process
}

// Where the checkpoint after `step` steps goes: model.ckpt when it is the run's last, else
// model_stepNNNNNN.ckpt.
inline std::string checkpoint_path(const std::string& dir, int step, bool final) {
    return final ? dir + "/model.ckpt" : strprintf("%s/model_step%06d.ckpt", dir.c_str(), step);
}

// The names in `dir` (sorted) that start with `prefix` and end with `suffix`.
inline std::vector<std::string> files_in(const std::string& dir, const std::string& prefix, const std::string& suffix) {
    std::vector<std::string> names;
    for (const std::string& n : list_dir(dir))
        if (n.size() >= prefix.size() + suffix.size() && n.compare(0, prefix.size(), prefix) == 0 &&
            n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0)
            names.push_back(n);
    return names;
}

// Temporary files an interrupted write left (checkpoint.h and utils.h write to NAME.tmp, then rename).
inline void remove_stale_temporaries(const std::string& dir) {
    for (const std::string& stale : files_in(dir, "", ".tmp")) {
        std::string path = dir + "/" + stale;
        if (remove(path.c_str()) == 0) printf("removed %s, left by an interrupted write\n", path.c_str());
    }
}

// The folder's checkpoints (by the names ./train gives them) whose headers read as such, with the steps recorded inside, newest step
// first (the final model.ckpt before an intermediate one of the same step).
struct CheckpointFile {
    std::string name;
    CheckpointInfo info;
};

// The names ./train gives checkpoints (checkpoint_path): model.ckpt and model_step<digits>.ckpt.
inline bool is_checkpoint_name(const std::string& name) {
    if (name == "model.ckpt") return true;
    const std::string prefix = "model_step", suffix = ".ckpt";
    if (name.size() <= prefix.size() + suffix.size() || name.compare(0, prefix.size(), prefix) != 0 ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
        return false;
    for (size_t i = prefix.size(); i < name.size() - suffix.size(); i++)
        if (!isdigit((unsigned char)name[i])) return false;
    return true;
}

// The names in `dir` that ./train gives checkpoints, sorted (a copy of the user's, model_best.ckpt, is not the run's).
inline std::vector<std::string> checkpoint_names(const std::string& dir) {
    std::vector<std::string> names;
    for (const std::string& name : files_in(dir, "model", ".ckpt"))
        if (is_checkpoint_name(name)) names.push_back(name);
    return names;
}

inline std::vector<CheckpointFile> checkpoints_in(const std::string& dir) {
    std::vector<CheckpointFile> found;
    for (const std::string& name : checkpoint_names(dir)) {
        CheckpointFile f{name, {}};
        if (checkpoint_peek(dir + "/" + name, &f.info)) found.push_back(f);
    }
    std::stable_sort(found.begin(), found.end(), [](const CheckpointFile& a, const CheckpointFile& b) {
        return a.info.step != b.info.step ? a.info.step > b.info.step : a.name == "model.ckpt" && b.name != "model.ckpt";
    });
    return found;
}

// A new run into a folder that already holds a run: when that run left a checkpoint, it can be
// resumed and is refused here; when it left none (killed before its first one), nothing can
// resume it, so its log is kept under a dated name and the new run starts its own.
inline void set_aside_unresumable_log(const std::string& dir, const std::string& log_path) {
    std::vector<std::string> names = checkpoint_names(dir);  // by name: a damaged checkpoint, or one of a newer format, counts too
    std::vector<CheckpointFile> readable = checkpoints_in(dir);
    bool have_log = file_exists(log_path);
    if (!names.empty())
        fail("%s: %s already there; resume it (%s %s/%s) or choose another output directory (%s)",
             (have_log ? log_path : dir).c_str(), have_log ? "a run log is" : "a run's checkpoints are",
             OPTION_NAME("--resume"), dir.c_str(), (readable.empty() ? names.back() : readable.front().name).c_str(),
             OPTION_NAME("--out"));
    if (!have_log) return;
    std::string kept = dir + "/" + utc_time("run-%Y%m%d-%H%M%S.attnlog");
    for (int n = 2; file_exists(kept); n++) kept = dir + "/" + utc_time("run-%Y%m%d-%H%M%S") + strprintf("-%d.attnlog", n);
    if (rename(log_path.c_str(), kept.c_str()) != 0) fail("%s: cannot rename it to %s: %s", log_path.c_str(), kept.c_str(), strerror(errno));
    printf("%s holds a run that left no checkpoint; kept as %s\n", log_path.c_str(), kept.c_str());
}

// Why a checkpoint written by `origin` at `step` may not resume into a folder whose log records
// `lineage`, or "" when it may. It may when the log is a training run's (not a measurement's), of
// the same run, and the continuation that wrote the checkpoint is on the log's line at that step:
// no continuation that began after it resumed from an earlier step (which abandoned what it wrote
// from there on). The log's first
// continuation may itself have resumed from a checkpoint of a continuation of another folder's
// log: checkpoints of that one up to the step it resumed from are on the line too.
inline std::string lineage_problem(const RunLineage& lineage, const CheckpointOrigin& origin, int64_t step) {
    if (lineage.measurement) return "it is the log of a measurement (--measure), which no training continues";
    if (!lineage.run_id || !origin.run_id) return "";  // a log or checkpoint from before runs had ids
    if (lineage.run_id != origin.run_id)
        return strprintf("it is the log of another run (run %016" PRIx64 "; the checkpoint's is run %016" PRIx64 ")",
                         lineage.run_id, origin.run_id);
    const std::vector<Continuation>& conts = lineage.continuations;
    if (conts.empty()) return "";
    size_t after;  // the continuations from here on began after the checkpoint's writer
    auto writer = std::find_if(conts.rbegin(), conts.rend(), [&](const Continuation& c) { return c.id == origin.continuation; });
    if (writer != conts.rend()) after = conts.rend() - writer;
    else if (conts[0].resumed_from == origin.continuation && step <= conts[0].start_step) after = 0;
    else return "the continuation that wrote the checkpoint never wrote into this log (the checkpoint belongs with another folder's log)";
    for (size_t j = after; j < conts.size(); j++)
        if (conts[j].start_step < step)
            return strprintf("the run was resumed from step %lld after this checkpoint of step %lld was written, which "
                             "abandoned it", (long long)conts[j].start_step, (long long)step);
    return "";
}

// --keep N: of the intermediate checkpoints at or before `step` (`written` was just written), only the
// N with the latest steps recorded inside stay. One of a later step (a longer run's, or of a
// continuation that was abandoned) is not older than this one, and is left alone; so is a file
// that does not read as a checkpoint or is not named as ./train names them. The checkpoint just
// written is never removed.
inline void remove_old_checkpoints(const std::string& dir, int keep, int64_t step, const std::string& written) {
    if (!keep) return;
    std::string newest = checkpoint_path(dir, (int)step, false);  // when it is the one just written: kept, counted first
    int kept = written == newest ? 1 : 0;
    for (const CheckpointFile& f : checkpoints_in(dir)) {
        std::string path = dir + "/" + f.name;
        if (f.name == "model.ckpt" || path == newest || f.info.step > step || ++kept <= keep) continue;
        if (remove(path.c_str()) != 0)
            fail("%s: cannot remove an old checkpoint (%s %d): %s", path.c_str(), OPTION_NAME("--keep"), keep, strerror(errno));
    }
}

// ---------------------------------------------------------------------------------------------
// The run and its folder

// A run as its folder, log and checkpoints know it: who it is, where it came from, where it
// writes. Rank 0's is the one that counts (it alone writes).
struct RunFolder {
    std::string dir;       // absolute, once taken
    std::string log_path;  // dir/run.attnlog
    uint64_t run_id = 0, continuation = 0;  // the run's, the same in all its logs and checkpoints; this start's
    std::string resumed_ckpt;               // -r's checkpoint; empty for a new run
    CheckpointOrigin resumed;               // -r: who wrote the checkpoint
    int64_t start_step = 0;                 // -r: the checkpoint's step
    std::string changes;                    // -r: the training options and data that differ from its run (resume.h)
};

// A new run, with ids of its own.
inline RunFolder new_run() {
    RunFolder f;
    f.run_id = new_run_id();
    f.continuation = new_run_id();
    return f;
}

// The run of checkpoint `ckpt` (`info`, its header), continued from its step by this start of
// ./train; `changes`: what differs from that run (resume.h's check_resume).
inline void continue_run(RunFolder& f, const std::string& ckpt, const CheckpointInfo& info, const std::string& changes) {
    f.resumed_ckpt = ckpt;
    f.resumed = info.origin;
    f.start_step = info.step;
    f.changes = changes;
    if (info.origin.run_id) f.run_id = info.origin.run_id;  // the same run (a checkpoint of version 3 says which)
}

// Takes the output folder: `out` (-o), by default runs/<UTC date and time> for a new run and the
// checkpoint's folder for a resumed one. Made when missing, locked for this process, cleared of
// the temporaries of an interrupted write.
inline void take_run_dir(RunFolder& f, const std::string& out) {
    std::string dir = out;
    if (dir.empty())
        dir = f.resumed_ckpt.empty() ? utc_time("runs/%Y%m%d-%H%M%S") : f.resumed_ckpt.substr(0, f.resumed_ckpt.find_last_of('/') + 1);
    if (dir.empty()) dir = ".";
    make_dirs(dir);
    f.dir = absolute_path(dir);
    lock_run_dir(f.dir);
    remove_stale_temporaries(f.dir);
    f.log_path = f.dir + "/run.attnlog";
}

// The run log of the folder take_run_dir took, for the run `info` describes (its ids and where it
// resumed from are filled in here): a resumed run appends to its log when the folder has one, if
// the checkpoint is on the line that log records; else the log is new (a resumed run's says
// where it began, one started from the weights of `init_ckpt` (-e) whose weights they are).
// Refused: another run's log or checkpoints in the folder.
inline RunLog open_run_log(const RunFolder& f, RunInfo info, const std::string& init_ckpt) {
    info.run_id = f.run_id;
    info.continuation = f.continuation;
    bool resuming = !f.resumed_ckpt.empty();
    if (resuming) {
        info.resumed_from = f.resumed.continuation;
        info.resumed_from_step = f.start_step;
    }
    if (resuming && file_exists(f.log_path))
        return runlog_open_append(f.log_path, info, f.start_step, f.changes, [&](const RunLineage& lineage) {
            std::string why = lineage_problem(lineage, f.resumed, f.start_step);
            if (!why.empty())
                fail("%s: cannot resume %s into this log: %s; resume into a new directory (%s) instead", f.log_path.c_str(),
                     f.resumed_ckpt.c_str(), why.c_str(), OPTION_NAME("--out"));
        });
    if (resuming) {  // into a folder without a log: its checkpoints, if any, must be this run's
        for (const CheckpointFile& c : checkpoints_in(f.dir))
            if (c.info.origin.run_id && c.info.origin.run_id != f.run_id)
                fail("%s: holds checkpoints of another run (%s); resume %s into its own directory or a new one (%s)",
                     f.dir.c_str(), c.name.c_str(), f.resumed_ckpt.c_str(), OPTION_NAME("--out"));
    } else {
        set_aside_unresumable_log(f.dir, f.log_path);
    }
    RunLog log = runlog_create(f.log_path, info);
    if (resuming)  // a resumed run in a new directory: its log says where it began
        runlog_note(log, f.start_step,
                    strprintf("resumed from step %lld of the run of %s", (long long)f.start_step,
                              absolute_path(f.resumed_ckpt).c_str()) + (f.changes.empty() ? "" : "; changed options: " + f.changes));
    if (!init_ckpt.empty() && is_directory(init_ckpt)) {  // a pretrained model: say which
        HfCheckpoint hf = hf_open(init_ckpt);
        runlog_note(log, 0, "started from the Hugging Face checkpoint " + absolute_path(init_ckpt) + " (" + hf.architecture + ", " +
                                hf_dtypes(hf) + " weights; this log's steps count from 0 at that point)");
    } else if (!init_ckpt.empty()) {  // a new run from another run's weights: say whose
        runlog_note(log, 0, strprintf("started from the weights of %s, trained for %lld steps (this log's steps count "
                                      "from 0 at that point)", init_ckpt.c_str(), (long long)checkpoint_read_header(init_ckpt).step));
    }
    return log;
}
