// Resuming a run from its checkpoint (-r): what must be as in the checkpoint's run (the data order,
// else the checkpoint's data position would mean other data), what may differ only with
// --allow-changes 1 (the training schedule, the data by its fingerprint; the run log records the
// change), and the command that resumes a run a signal stopped. The run folder's side of resuming
// (which log a checkpoint may continue) is run_dir.h's.
#pragma once
#include <string>
#include <vector>
#include "checkpoint.h"
#include "options.h"
#include "utils.h"

// The training options of this run that differ from those of the checkpoint's, as
// "-l (--lr) 0.003 -> 0.01, ..."; empty when none do or the checkpoint does not record them.
inline std::string schedule_changes(const TrainingSchedule& was, const TrainingSchedule& now) {
    if (was.lr == 0) return "";
    std::string changes;
    auto differ = [&](const std::string& option, double then, double here) {
        if (then != here) changes += strprintf("%s%s %g -> %g", changes.empty() ? "" : ", ", option.c_str(), then, here);
    };
    for (const ScheduleOption& s : kScheduleOptions)
        if (s.float_field) differ(option_label(s.name), was.*s.float_field, now.*s.float_field);
        else differ(option_label(s.name), was.*s.int_field, now.*s.int_field);
    if (was.cpu_threads && now.cpu_threads)
        differ(option_label("--threads") + " (times processes)", was.cpu_threads, now.cpu_threads);
    auto kinds_differ = [&](const char* option, uint32_t then, uint32_t here) {
        if (then != here)
            changes += strprintf("%s%s %s -> %s", changes.empty() ? "" : ", ", option, param_kinds_text(then).c_str(),
                                 param_kinds_text(here).c_str());
    };
    kinds_differ(OPTION_LABEL("--freeze"), was.frozen, now.frozen);
    kinds_differ(OPTION_LABEL("--decay"), was.decayed, now.decayed);
    return changes;
}

// The data of this run that differs from the checkpoint's run's, by fingerprint (0: no validation
// data), in the words of schedule_changes; none when the checkpoint does not record its data.
inline std::vector<std::string> data_changes(const CheckpointOrigin& was, const CheckpointOrigin& now) {
    std::vector<std::string> changes;
    if (!was.run_id) return changes;
    if (was.train_data != now.train_data) changes.push_back(OPTION_LABEL("--train") + std::string(" other training data"));
    if (was.val_data != now.val_data)
        changes.push_back(OPTION_LABEL("--val") + std::string(!now.val_data ? " no validation data"
                                                              : was.val_data ? " other validation data"
                                                                             : " validation data added"));
    return changes;
}

// Checks the checkpoint `ckpt` that -r resumes (`was`, its header) against this run (`now`: what a
// checkpoint of this run would record) before anything is trained: it holds the optimiser state,
// is before the last step (-x), and was trained in the same data order. Returns the training
// options and data that differ (schedule_changes, data_changes), and fails when some do and
// --allow-changes is not 1.
inline std::string check_resume(const std::string& ckpt, const CheckpointInfo& was, const CheckpointInfo& now,
                                const Options& o) {
    if (!was.has_optimizer_state)
        fail("%s: cannot resume: the checkpoint holds no optimiser state (start from it with %s)", ckpt.c_str(),
             OPTION_NAME("--init"));
    if (was.step >= o.steps)
        fail("option %s %d: the checkpoint %s is already at step %d", OPTION_LABEL("--steps"), o.steps, ckpt.c_str(),
             (int)was.step);
    const DataOrder &then = was.data_order, &here = now.data_order;
    struct { long long now, then; const char* option; } same[] = {
        {here.batch, then.batch, OPTION_LABEL("--batch")}, {here.seq_len, then.seq_len, OPTION_LABEL("--seq-len")},
        {here.total_batch, then.total_batch, OPTION_LABEL("--total-batch")},
        {here.shuffle, then.shuffle, OPTION_LABEL("--shuffle")}, {here.seed, then.seed, OPTION_LABEL("--seed")}};
    for (const auto& x : same)
        if (then.batch && x.now != x.then)  // recorded: the data order must be the same
            fail("option %s is %lld but the run of %s used %lld; resume with the same data order", x.option, x.now,
                 ckpt.c_str(), x.then);
    std::string changes = schedule_changes(was.schedule, now.schedule);
    for (const std::string& change : data_changes(was.origin, now.origin)) changes += (changes.empty() ? "" : ", ") + change;
    if (!changes.empty() && !o.allow_changes)
        fail("options %s differ from the run of %s; resume with its options, or add %s 1 to go on with these (the "
             "run log records the change)%s", changes.c_str(), ckpt.c_str(), OPTION_LABEL("--allow-changes"),
             changes.find("--threads") == std::string::npos ? "" :
             "; another count of threads (or of processes) changes the last bits of the CPU's float sums, so "
             "the run would not repeat an uninterrupted one bit for bit");
    return changes;
}

// The command that resumes a run from `ckpt`: the command line `argv` as typed, with -r instead
// of -e, -r or -o (a resumed run writes beside its checkpoint).
inline std::string resume_command(const std::vector<std::string>& argv, const std::string& ckpt) {
    std::string cmd = shell_quote(argv[0].find('/') != std::string::npos ? absolute_path(argv[0]) : argv[0]);
    const OptSpec* replaced[] = {&kOptions[option_index("--resume")], &kOptions[option_index("--init")],
                                 &kOptions[option_index("--out")]};
    for (size_t i = 1; i < argv.size(); i++) {
        bool dropped = false;
        for (const OptSpec* s : replaced) dropped |= argv[i] == s->long_name || (s->short_name[0] && argv[i] == s->short_name);
        if (dropped) i++;  // and its value
        else cmd += " " + shell_quote(argv[i]);
    }
    return cmd + " " + OPTION_NAME("--resume") + " " + shell_quote(absolute_path(ckpt));
}
