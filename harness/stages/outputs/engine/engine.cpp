// llama-harness-engine: one model load, many greedy generations and teacher-forced scorings.
//
// Command line: llama-completion's own arguments (parsed by common_params_parse for
// LLAMA_EXAMPLE_COMPLETION), so a configuration's args and env reach the model and the
// context exactly as they reach llama-completion. -n is the number of tokens generated per
// request.
//
// Requests, one per line on stdin, fields separated by a tab; text and paths are hex-encoded
// bytes so that no byte needs escaping:
//
//   generate <prompt>
//       Greedy generation as llama-completion does it: the prompt tokenized with special
//       tokens parsed and BOS added per the vocabulary, decoded in chunks of n_batch, then one
//       token per decode, each chosen by the configured sampler chain (temperature 0: the
//       highest logit). Generation stops after an end-of-generation token (which is recorded)
//       or after n_predict tokens. A prompt that ends in an end-of-generation token (or any of
//       its n_batch-token batches does) generates nothing, as llama-completion.
//   score <prompt> <id,id,...> <dump path or -> <reference dump path or ->
//       Teacher forcing: the prompt plus the given tokens decoded in chunks of n_batch; for
//       generated position k the distribution over the vocabulary given the prompt and tokens
//       0..k-1. With a dump path, the log-probabilities (float32, n_positions x n_vocab after
//       an int32 header of n_positions and n_vocab) are written there. With a reference dump,
//       KL(reference || this) in nats and top-1 agreement are computed per position.
//   bench <n_prompt> <n_gen>
//       A timed request for speed measurements, as llama-bench times pp and tg: the memory
//       cleared, n_prompt token ids (BOS where the vocabulary adds one, then ids drawn from a
//       generator of fixed seed, the same in every process) decoded in chunks of n_batch
//       (prompt processing), then n_gen more ids of that generator decoded one per decode
//       (generation; no sampling, as llama-bench's tg). Each timed part ends when the GPU's work
//       has finished (llama_synchronize, as llama-bench). Replies the two wall times in
//       milliseconds, each generated token's, and the time the prompt took to queue.
//   probe <path>
//       What the runtime says about the model's weights, written as JSON to path (the harness asks once
//       per load, never in the speed stage). A context of its own, whose scheduler eval callback sees
//       every weight the graphs read as a source of the nodes reading it, decodes one token: fewer than
//       the 32 at which a backend takes over an op on host weights and reads a copy of them in a compute
//       buffer. The callback inspects the sources while it is asked, and declines, so the graph is not
//       split and the numerics do not change. Per weight and per weight buffer: name, layer, type,
//       bytes, buffer and buffer type (read from the tensor), and for host memory the bytes the driver
//       reports page-locked (CUDA builds: cudaPointerGetAttributes, cudaMemoryTypeHost, sampled every
//       MiB), the bytes the memory map names as the model file's (/proc/self/smaps; on Windows VirtualQuery,
//       MEM_MAPPED) and of those, by the OS's page flags, the bytes whose pages are the file's and those whose
//       pages are private copies (/proc/self/pagemap; on Windows QueryWorkingSetEx, shared or not); and per
//       mapping of the model file, the bytes smaps reports resident, shared clean, private and anonymous.
//       Replies the counts and the time it took.
//   reload <count> <path>
//       Repeated loads in one process, as a server loads, frees and loads a model again: beside the engine's
//       own load, the model is loaded with the same model parameters, its weights found as probe finds them,
//       and freed, count times. Per load, written as JSON to path: per weight buffer its type, bytes and the
//       bytes the driver reports page-locked while loaded and, asked again for the same range, after the free;
//       the process's resident, locked (VmLck) and pinned (VmPin) bytes while loaded and after the free
//       (/proc/self/status; on Windows the working set only); and those of the process before the first load.
//       Replies the count and the time it took.
//   quit
//
// Replies, one per request, are single lines on stdout starting with "@@engine " followed by
// a JSON object; everything else the libraries print goes to stderr (or, if anything, to
// stdout without that prefix).

#include "arg.h"
#include "common.h"
#include "log.h"
#include "sampling.h"
#include "llama.h"
#include "ggml-backend.h"

#include <algorithm>
#include <chrono>
#include <clocale>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#if defined(_WIN32)
#include <fcntl.h>
#include <io.h>
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#ifndef NOMINMAX
#define NOMINMAX
#endif
#include <windows.h>
#ifndef PSAPI_VERSION
#define PSAPI_VERSION 2  // QueryWorkingSetEx from kernel32 (K32QueryWorkingSetEx): no psapi library to link
#endif
#include <psapi.h>
#else
#include <climits>
#include <cstdlib>
#include <fcntl.h>
#include <unistd.h>
#endif

#if defined(HARNESS_ENGINE_PROBE_HEADER)
// the GPU kind's page-locked query, harness_probe_page_locked (harness/kinds/shape.py, EngineProbe; targets.cmake)
#include HARNESS_ENGINE_PROBE_HEADER
#endif

namespace {

using clock_type = std::chrono::steady_clock;

double ms_since(clock_type::time_point start) {
    return std::chrono::duration<double, std::milli>(clock_type::now() - start).count();
}

bool hex_decode(const std::string & hex, std::string & out) {
    if (hex.size() % 2 != 0) {
        return false;
    }
    out.clear();
    out.reserve(hex.size() / 2);
    for (size_t i = 0; i < hex.size(); i += 2) {
        int value = 0;
        for (size_t j = i; j < i + 2; j++) {
            const char c = hex[j];
            value <<= 4;
            if (c >= '0' && c <= '9') {
                value |= c - '0';
            } else if (c >= 'a' && c <= 'f') {
                value |= c - 'a' + 10;
            } else if (c >= 'A' && c <= 'F') {
                value |= c - 'A' + 10;
            } else {
                return false;
            }
        }
        out.push_back((char) value);
    }
    return true;
}

std::string hex_encode(const std::string & bytes) {
    static const char digits[] = "0123456789abcdef";
    std::string out;
    out.reserve(bytes.size() * 2);
    for (unsigned char c : bytes) {
        out.push_back(digits[c >> 4]);
        out.push_back(digits[c & 15]);
    }
    return out;
}

// a JSON number; non-finite values as the literals Python's json module reads
std::string json_number(double v) {
    if (std::isnan(v)) {
        return "NaN";
    }
    if (std::isinf(v)) {
        return v > 0 ? "Infinity" : "-Infinity";
    }
    char buf[64];
    snprintf(buf, sizeof(buf), "%.9g", v);
    return buf;
}

std::string json_string(const std::string & s) {
    std::string out = "\"";
    for (unsigned char c : s) {
        if (c == '"' || c == '\\') {
            out.push_back('\\');
            out.push_back((char) c);
        } else if (c < 0x20 || c >= 0x7f) {
            char buf[8];
            snprintf(buf, sizeof(buf), "\\u%04x", c);
            out += buf;
        } else {
            out.push_back((char) c);
        }
    }
    return out + "\"";
}

void reply(const std::string & json) {
    fputs("@@engine ", stdout);
    fputs(json.c_str(), stdout);
    fputc('\n', stdout);
    fflush(stdout);
}

void reply_error(const std::string & message) {
    reply("{\"ok\":false,\"error\":" + json_string(message) + "}");
}

std::vector<std::string> split_tabs(const std::string & line) {
    std::vector<std::string> parts;
    size_t start = 0;
    while (true) {
        const size_t tab = line.find('\t', start);
        parts.push_back(line.substr(start, tab == std::string::npos ? std::string::npos : tab - start));
        if (tab == std::string::npos) {
            return parts;
        }
        start = tab + 1;
    }
}

// the two highest logits (ties: the lower id first, as the greedy sampler keeps the first
// maximum) and the log of the sum of exp over the whole row
struct row_facts {
    llama_token top1 = 0;
    llama_token top2 = 0;
    float logit1 = -INFINITY;
    float logit2 = -INFINITY;
    double lse = 0.0;
};

row_facts facts_of(const float * logits, int n_vocab) {
    row_facts f;
    for (int i = 0; i < n_vocab; i++) {
        const float v = logits[i];
        if (v > f.logit1) {
            f.top2 = f.top1;
            f.logit2 = f.logit1;
            f.top1 = i;
            f.logit1 = v;
        } else if (v > f.logit2) {
            f.top2 = i;
            f.logit2 = v;
        }
    }
    double sum = 0.0;
    for (int i = 0; i < n_vocab; i++) {
        sum += std::exp((double) logits[i] - (double) f.logit1);
    }
    f.lse = (double) f.logit1 + std::log(sum);
    return f;
}

// ---------------------------------------------------------------------------------------------- probe

// the weights the graphs read, in the order the scheduler's eval callback first sees them
struct probe_state {
    std::vector<const ggml_tensor *> weights;
    std::set<const ggml_tensor *> seen;
};

const ggml_tensor * probe_weight_of(const ggml_tensor * t) {
    if (t == nullptr) {
        return nullptr;
    }
    if (t->view_src != nullptr) {
        t = t->view_src;  // a view of a weight reads the weight
    }
    if (t->buffer == nullptr || t->data == nullptr ||
            ggml_backend_buffer_get_usage(t->buffer) != GGML_BACKEND_BUFFER_USAGE_WEIGHTS) {
        return nullptr;  // an activation, or a scheduler copy of a weight in a compute buffer
    }
    return t;
}

// the scheduler asks (ask == true) whether the node is to be observed: the sources are read then and the
// answer is no, so that the graph is computed as without a callback
bool probe_eval(ggml_tensor * t, bool ask, void * user_data) {
    auto * st = (probe_state *) user_data;
    if (ask) {
        for (int i = 0; i < GGML_MAX_SRC; i++) {
            const ggml_tensor * w = probe_weight_of(t->src[i]);
            if (w != nullptr && st->seen.insert(w).second) {
                st->weights.push_back(w);
            }
        }
    }
    return false;
}

// the layer of a tensor named blk.<n>.*, else -1
int probe_layer(const char * name) {
    int layer = -1;
    return sscanf(name, "blk.%d.", &layer) == 1 ? layer : -1;
}

constexpr size_t PROBE_STEP = 1u << 20;  // page-locked bytes are sampled at most 1 MiB apart

// bytes of [p, p + n) the driver reports page-locked, -1 where the build has no GPU runtime's probe: the range
// is sampled every PROBE_STEP bytes and each sample stands for the bytes up to the next one
long long probe_page_locked(const char * p, size_t n) {
#if defined(HARNESS_ENGINE_PROBE_HEADER)
    return harness_probe_page_locked(p, n, PROBE_STEP);
#else
    (void) p;
    (void) n;
    return -1;
#endif
}

// the address ranges of this process the memory map names as the model file's, and the state of their pages
// as the OS reports it: a range the map names as the file's may hold private copies of the file's pages
// (a private writable mapping written to), which the map's name does not show
struct probe_file_map {
    struct mapping {
        uintptr_t lo, hi;
        long long rss, shared_clean, private_clean, private_dirty, anonymous;  // bytes, /proc/self/smaps
    };
    std::vector<mapping> ranges;
    bool known = false;
    bool pages_known = false;
#if !defined(_WIN32)
    int pagemap = -1;
#endif

    explicit probe_file_map(const std::string & model_path) {
#if defined(_WIN32)
        (void) model_path;
        known = true;  // VirtualQuery and QueryWorkingSetEx are asked per range
        pages_known = true;
#else
        char resolved[PATH_MAX];
        const std::string want = realpath(model_path.c_str(), resolved) ? std::string(resolved) : model_path;
        // /proc/self/smaps: a header line per mapping (start-end perms offset dev inode path), then "Key: N kB"
        std::ifstream smaps("/proc/self/smaps");
        std::string line;
        mapping * cur = nullptr;
        while (std::getline(smaps, line)) {
            std::istringstream in(line);
            std::string first;
            in >> first;
            const size_t dash = first.find('-');
            if (dash != std::string::npos && first.back() != ':') {
                std::string perms, offset, dev, inode, path;
                in >> perms >> offset >> dev >> inode;
                std::getline(in >> std::ws, path);
                cur = nullptr;
                if (path == want) {
                    ranges.push_back({ (uintptr_t) std::stoull(first.substr(0, dash), nullptr, 16),
                                       (uintptr_t) std::stoull(first.substr(dash + 1), nullptr, 16), 0, 0, 0, 0, 0 });
                    cur = &ranges.back();
                }
                continue;
            }
            long long kb = 0;
            if (cur == nullptr || !(in >> kb)) {
                continue;
            }
            const long long bytes = kb * 1024;
            if (first == "Rss:") {
                cur->rss = bytes;
            } else if (first == "Shared_Clean:") {
                cur->shared_clean = bytes;
            } else if (first == "Private_Clean:") {
                cur->private_clean = bytes;
            } else if (first == "Private_Dirty:") {
                cur->private_dirty = bytes;
            } else if (first == "Anonymous:") {
                cur->anonymous = bytes;
            }
        }
        known = smaps.is_open();
        // /proc/self/pagemap: 8 bytes per virtual page, bit 63 present, 62 swapped, 61 file page or shared
        // anonymous (the kernel's Documentation/admin-guide/mm/pagemap.rst); the flags are readable without
        // CAP_SYS_ADMIN, which only the page frame numbers need
        pagemap = open("/proc/self/pagemap", O_RDONLY);
        pages_known = pagemap >= 0;
#endif
    }

    ~probe_file_map() {
#if !defined(_WIN32)
        if (pagemap >= 0) {
            close(pagemap);
        }
#endif
    }

    probe_file_map(const probe_file_map &) = delete;
    probe_file_map & operator=(const probe_file_map &) = delete;

    // bytes of [p, p + n) the memory map names as the model file's
    long long backed(const char * p, size_t n) const {
        if (!known) {
            return -1;
        }
        long long total = 0;
#if defined(_WIN32)
        const char * q = p;
        const char * end = p + n;
        while (q < end) {
            MEMORY_BASIC_INFORMATION mbi;
            if (VirtualQuery(q, &mbi, sizeof(mbi)) == 0) {
                break;
            }
            const char * region_end = (const char *) mbi.BaseAddress + mbi.RegionSize;
            const char * stop = std::min(region_end, end);
            if (mbi.Type == MEM_MAPPED) {
                total += (long long) (stop - q);
            }
            q = stop;
        }
#else
        const uintptr_t lo = (uintptr_t) p;
        const uintptr_t hi = lo + n;
        for (const auto & r : ranges) {
            const uintptr_t a = std::max(lo, r.lo);
            const uintptr_t b = std::min(hi, r.hi);
            if (a < b) {
                total += (long long) (b - a);
            }
        }
#endif
        return total;
    }

    // of the bytes of [p, p + n) the map names as the model file's: those whose pages are the file's and those
    // whose pages are private copies, by the OS's page flags; {-1, -1} where the OS cannot be asked.
    // Linux (pagemap): a resident page is the file's when flagged a file page, a private copy otherwise; a page
    // not resident is a private copy when swapped out, the file's otherwise (a read fetches it from the file).
    // Windows (QueryWorkingSetEx): a page in the working set is the file's when shared, a private copy
    // otherwise; a page outside the working set is in neither count (the call does not tell).
    std::pair<long long, long long> pages(const char * p, size_t n) const {
        if (!pages_known) {
            return { -1, -1 };
        }
        long long file = 0;
        long long priv = 0;
#if defined(_WIN32)
        SYSTEM_INFO si;
        GetSystemInfo(&si);
        const uintptr_t page = si.dwPageSize;
        const char * q = p;
        const char * end = p + n;
        std::vector<PSAPI_WORKING_SET_EX_INFORMATION> info;
        while (q < end) {
            MEMORY_BASIC_INFORMATION mbi;
            if (VirtualQuery(q, &mbi, sizeof(mbi)) == 0) {
                break;
            }
            const char * stop = std::min((const char *) mbi.BaseAddress + mbi.RegionSize, end);
            if (mbi.Type == MEM_MAPPED) {
                const uintptr_t first = (uintptr_t) q & ~(page - 1);
                info.clear();
                for (uintptr_t a = first; a < (uintptr_t) stop; a += page) {
                    PSAPI_WORKING_SET_EX_INFORMATION e = {};
                    e.VirtualAddress = (PVOID) a;
                    info.push_back(e);
                }
                if (!QueryWorkingSetEx(GetCurrentProcess(), info.data(),
                                          (DWORD) (info.size() * sizeof(PSAPI_WORKING_SET_EX_INFORMATION)))) {
                    return { -1, -1 };
                }
                for (const auto & e : info) {
                    const uintptr_t a = std::max((uintptr_t) e.VirtualAddress, (uintptr_t) q);
                    const uintptr_t b = std::min((uintptr_t) e.VirtualAddress + page, (uintptr_t) stop);
                    if (e.VirtualAttributes.Valid) {
                        (e.VirtualAttributes.Shared ? file : priv) += (long long) (b - a);
                    }
                }
            }
            q = stop;
        }
#else
        const uintptr_t page = (uintptr_t) sysconf(_SC_PAGESIZE);
        const uintptr_t lo = (uintptr_t) p;
        const uintptr_t hi = lo + n;
        std::vector<uint64_t> entries;
        for (const auto & r : ranges) {
            const uintptr_t a = std::max(lo, r.lo);
            const uintptr_t b = std::min(hi, r.hi);
            for (uintptr_t first = a & ~(page - 1); first < b; first += page * 4096) {
                const uintptr_t last = std::min(b, first + page * 4096);  // at most 4096 entries a read
                entries.resize((last - first + page - 1) / page);
                const size_t want = entries.size() * sizeof(uint64_t);
                if (pread(pagemap, entries.data(), want, (off_t) (first / page * sizeof(uint64_t))) != (ssize_t) want) {
                    return { -1, -1 };
                }
                for (size_t i = 0; i < entries.size(); i++) {
                    const uintptr_t pa = std::max(a, first + i * page);
                    const uintptr_t pb = std::min(last, first + (i + 1) * page);
                    const uint64_t e = entries[i];
                    const bool present = (e >> 63) & 1;
                    const bool swapped = (e >> 62) & 1;
                    const bool file_page = (e >> 61) & 1;
                    ((present && !file_page) || (!present && swapped) ? priv : file) += (long long) (pb - pa);
                }
            }
        }
#endif
        return { file, priv };
    }

    // the model file's mappings as JSON: range and the bytes /proc/self/smaps reports resident, shared clean,
    // private clean, private dirty and anonymous (null on Windows)
    std::string mappings_json() const {
#if defined(_WIN32)
        return "null";
#else
        std::ostringstream out;
        out << "[";
        for (size_t i = 0; i < ranges.size(); i++) {
            const mapping & m = ranges[i];
            out << (i ? "," : "") << "{\"bytes\":" << (m.hi - m.lo) << ",\"rss\":" << m.rss << ",\"shared_clean\":"
                << m.shared_clean << ",\"private_clean\":" << m.private_clean << ",\"private_dirty\":" << m.private_dirty
                << ",\"anonymous\":" << m.anonymous << "}";
        }
        out << "]";
        return out.str();
#endif
    }
};

std::string probe_memory_json(const char * p, size_t n, bool host, const probe_file_map & map) {
    if (!host) {
        return "\"page_locked\":null,\"file_backed\":null,\"file_pages\":null,\"private_pages\":null";
    }
    const long long locked = probe_page_locked(p, n);
    const long long backed = map.backed(p, n);
    const auto pages = map.pages(p, n);
    auto count = [](long long v) { return v < 0 ? std::string("null") : std::to_string(v); };
    return "\"page_locked\":" + count(locked) + ",\"file_backed\":" + count(backed) + ",\"file_pages\":" +
           count(pages.first) + ",\"private_pages\":" + count(pages.second);
}

// the process's memory as the OS reports it, as JSON in bytes: resident (VmRSS), locked (VmLck: mlock) and
// pinned (VmPin: pages a driver pinned and accounted) from /proc/self/status; on Windows the working set
// (GetProcessMemoryInfo) and null for the others
std::string probe_status_json() {
    long long rss = -1;
    long long locked = -1;
    long long pinned = -1;
#if defined(_WIN32)
    PROCESS_MEMORY_COUNTERS pmc = {};
    if (GetProcessMemoryInfo(GetCurrentProcess(), &pmc, sizeof(pmc))) {
        rss = (long long) pmc.WorkingSetSize;
    }
#else
    std::ifstream status("/proc/self/status");
    std::string key;
    long long kb = 0;
    std::string unit;
    while (status >> key) {
        if (key == "VmRSS:" || key == "VmLck:" || key == "VmPin:") {
            status >> kb >> unit;
            (key == "VmRSS:" ? rss : key == "VmLck:" ? locked : pinned) = kb * 1024;
        }
        status.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
    }
#endif
    auto count = [](long long v) { return v < 0 ? std::string("null") : std::to_string(v); };
    return "{\"rss\":" + count(rss) + ",\"locked\":" + count(locked) + ",\"pinned\":" + count(pinned) + "}";
}

// "driver":"<name>" for an engine built with a GPU kind's probe ("cuda": the CUDA runtime), else "driver":null
std::string probe_driver_json() {
#if defined(HARNESS_ENGINE_PROBE_HEADER)
    return "\"driver\":\"" HARNESS_ENGINE_PROBE_DRIVER "\"";
#else
    return "\"driver\":null";
#endif
}

// text written to path whole; false where it could not be
bool write_text(const std::string & path, const std::string & text) {
    FILE * f = fopen(path.c_str(), "wb");
    bool written = f != nullptr && fwrite(text.data(), 1, text.size(), f) == text.size();
    return (f != nullptr && fclose(f) == 0) && written;
}

struct engine {
    common_params & params;
    llama_model * model;
    llama_context * ctx;
    const llama_vocab * vocab;
    common_sampler * smpl;
    int n_vocab;
    int n_ctx;

    std::vector<llama_token> tokenize_prompt(const std::string & prompt) const {
        std::vector<llama_token> tokens = common_tokenize(ctx, prompt, true, true);
        if (tokens.empty() && llama_vocab_get_add_bos(vocab)) {
            tokens.push_back(llama_vocab_bos(vocab));
        }
        return tokens;
    }

    // decode tokens[first..] at positions first.. in chunks of n_batch, as common_prompt_batch_decode does;
    // on_outputs(batch index, position) is called after each chunk for the positions with output set.
    // Through common_batch and llama_process, the entry point of upstream's own programs (llama-completion
    // through common, llama-bench, llama-server), where the upstream built has it; through llama_batch and
    // llama_decode on the older commits a forecast names (those llama-cpp-python 0.3.30-0.3.35 vendor),
    // which have only those (targets.cmake defines HARNESS_ENGINE_LLAMA_PROCESS from llama.h).
    template <typename F>
    bool decode(const std::vector<llama_token> & tokens, size_t first, size_t first_output, F on_output) {
        const size_t n_batch = (size_t) std::max(1, params.n_batch);
#if defined(HARNESS_ENGINE_LLAMA_PROCESS)
        common_batch batch(ctx);
#else
        llama_batch batch = llama_batch_init((int32_t) n_batch, 0, 1);
#endif
        bool ok = true;
        for (size_t start = first; ok && start < tokens.size(); start += n_batch) {
            const size_t end = std::min(tokens.size(), start + n_batch);
#if defined(HARNESS_ENGINE_LLAMA_PROCESS)
            batch.clear();
            for (size_t i = start; i < end; i++) {
                batch.add(tokens[i], (llama_pos) i, 0, i >= first_output || i + 1 == tokens.size());
            }
            ok = llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch.get()) == 0;
#else
            batch.n_tokens = 0;
            for (size_t i = start; i < end; i++) {
                const int32_t k = batch.n_tokens++;
                batch.token[k] = tokens[i];
                batch.pos[k] = (llama_pos) i;
                batch.n_seq_id[k] = 1;
                batch.seq_id[k][0] = 0;
                batch.logits[k] = i >= first_output || i + 1 == tokens.size();
            }
            ok = llama_decode(ctx, batch) == 0;
#endif
            for (size_t i = start; ok && i < end; i++) {
                if (i >= first_output || i + 1 == tokens.size()) {
                    ok = on_output((int32_t) (i - start), i);
                }
            }
        }
#if !defined(HARNESS_ENGINE_LLAMA_PROCESS)
        llama_batch_free(batch);
#endif
        return ok;
    }

    void generate(const std::string & prompt) {
        const auto t_start = clock_type::now();
        std::vector<llama_token> tokens = tokenize_prompt(prompt);
        const size_t n_prompt = tokens.size();
        const int n_predict = params.n_predict;
        if (n_prompt == 0) {
            reply_error("the prompt is empty and the vocabulary adds no BOS token");
            return;
        }
        if (n_predict <= 0 || (int) n_prompt + n_predict > n_ctx) {
            reply_error("prompt (" + std::to_string(n_prompt) + " tokens) plus n_predict (" + std::to_string(n_predict) +
                        ") must be positive and fit the context (" + std::to_string(n_ctx) + " tokens)");
            return;
        }
        // llama-completion queues the prompt n_batch tokens at a time and ends the run, before that batch is
        // decoded, when the queued batch ends in an end-of-generation token (tools/completion/completion.cpp,
        // "end of generation"): nothing is generated
        const size_t n_batch = (size_t) std::max(1, params.n_batch);
        for (size_t start = 0; start < n_prompt; start += n_batch) {
            if (llama_vocab_is_eog(vocab, tokens[std::min(n_prompt, start + n_batch) - 1])) {
                reply("{\"ok\":true,\"prompt_tokens\":" + std::to_string(n_prompt) +
                      ",\"tokens\":[],\"eog\":true,\"prompt_ms\":" + json_number(ms_since(t_start)) + ",\"gen_ms\":0}");
                return;
            }
        }
        llama_memory_clear(llama_get_memory(ctx), true);
        common_sampler_reset(smpl);
        for (llama_token t : tokens) {
            common_sampler_accept(smpl, t, false);
        }
        // prompt: only the last token's logits are needed
        if (!decode(tokens, 0, tokens.size(), [](int32_t, size_t) { return true; })) {
            reply_error("llama_process failed on the prompt");
            return;
        }
        const double prompt_ms = ms_since(t_start);
        const auto t_gen = clock_type::now();

        std::ostringstream out;
        out << "{\"ok\":true,\"prompt_tokens\":" << n_prompt << ",\"tokens\":[";
        bool eog = false;
        for (int n = 0; n < n_predict; n++) {
            const llama_token id = common_sampler_sample(smpl, ctx, -1);
            common_sampler_accept(smpl, id, true);
            const row_facts f = facts_of(llama_get_logits_ith(ctx, -1), n_vocab);
            eog = llama_vocab_is_eog(vocab, id);
            out << (n ? "," : "") << "{\"id\":" << id
                << ",\"piece\":\"" << hex_encode(common_token_to_piece(ctx, id, params.special)) << "\""
                << ",\"eog\":" << (eog ? "true" : "false")
                << ",\"top\":[[" << f.top1 << "," << json_number(f.logit1) << "],["
                << f.top2 << "," << json_number(f.logit2) << "]]"
                << ",\"lse\":" << json_number(f.lse) << "}";
            if (eog || n + 1 == n_predict) {
                break;
            }
            tokens.push_back(id);
            if (!decode(tokens, tokens.size() - 1, tokens.size(), [](int32_t, size_t) { return true; })) {
                reply_error("llama_process failed at generated token " + std::to_string(n));
                return;
            }
        }
        out << "],\"eog\":" << (eog ? "true" : "false")
            << ",\"prompt_ms\":" << json_number(prompt_ms) << ",\"gen_ms\":" << json_number(ms_since(t_gen)) << "}";
        reply(out.str());
    }

    void bench(const std::string & n_prompt_text, const std::string & n_gen_text) {
        long n_prompt = 0;
        long n_gen = 0;
        try {
            n_prompt = std::stol(n_prompt_text);
            n_gen = std::stol(n_gen_text);
        } catch (const std::exception &) {
            reply_error("bench needs two token counts, not " + json_string(n_prompt_text) + " " + json_string(n_gen_text));
            return;
        }
        if (n_prompt < 1 || n_gen < 1 || n_prompt + n_gen > n_ctx) {
            reply_error("bench: n_prompt (" + std::to_string(n_prompt) + ") and n_gen (" + std::to_string(n_gen) +
                        ") must be positive and fit the context (" + std::to_string(n_ctx) + " tokens)");
            return;
        }
        // token ids of a fixed-seed linear congruential generator: the same ids in every process; the prompt
        // starts with BOS where the vocabulary adds one, and each generated token's id is the generator's next
        // (no sampling, as llama-bench's tg: what is timed is the decode, which the series can change)
        uint32_t state = 12345;
        auto next_id = [&]() {
            state = state * 1664525u + 1013904223u;
            return (llama_token) ((state >> 8) % (uint32_t) n_vocab);
        };
        std::vector<llama_token> tokens;
        tokens.reserve(n_prompt + n_gen);
        if (llama_vocab_get_add_bos(vocab)) {
            tokens.push_back(llama_vocab_bos(vocab));
        }
        while ((long) tokens.size() < n_prompt) {
            tokens.push_back(next_id());
        }
        llama_memory_clear(llama_get_memory(ctx), true);
        llama_synchronize(ctx);
        // A decode returns once its work is queued; the outputs are waited for when they are read. So each
        // timed part ends with llama_synchronize, as llama-bench's test_prompt and test_gen do: without it
        // the prompt's time is the time to queue its kernels on a GPU, and its work spills into the first
        // generated token. pp_queued_ms is that queueing time, kept to show the difference.
        const auto t_pp = clock_type::now();
        if (!decode(tokens, 0, tokens.size(), [](int32_t, size_t) { return true; })) {
            reply_error("llama_process failed on the bench prompt");
            return;
        }
        const double pp_queued_ms = ms_since(t_pp);
        llama_synchronize(ctx);
        const double pp_ms = ms_since(t_pp);
        const auto t_tg = clock_type::now();
        std::ostringstream token_ms;
        for (long n = 0; n < n_gen; n++) {
            const auto t_token = clock_type::now();
            tokens.push_back(next_id());
            if (!decode(tokens, tokens.size() - 1, tokens.size(), [](int32_t, size_t) { return true; })) {
                reply_error("llama_process failed at bench token " + std::to_string(n));
                return;
            }
            llama_synchronize(ctx);
            token_ms << (n ? "," : "") << json_number(ms_since(t_token));
        }
        const double tg_ms = ms_since(t_tg);
        reply("{\"ok\":true,\"n_prompt\":" + std::to_string(n_prompt) + ",\"n_gen\":" + std::to_string(n_gen) +
              ",\"pp_ms\":" + json_number(pp_ms) + ",\"pp_queued_ms\":" + json_number(pp_queued_ms) +
              ",\"tg_ms\":" + json_number(tg_ms) + ",\"tg_token_ms\":[" + token_ms.str() + "]}");
    }

    void score(const std::string & prompt, const std::string & ids_text, const std::string & dump_path,
               const std::string & ref_path) {
        const auto t_start = clock_type::now();
        std::vector<llama_token> forced;
        {
            std::stringstream ss(ids_text);
            std::string item;
            while (std::getline(ss, item, ',')) {
                if (item.empty()) {
                    continue;
                }
                try {
                    const long v = std::stol(item);
                    if (v < 0 || v >= n_vocab) {
                        reply_error("token id " + item + " outside the vocabulary");
                        return;
                    }
                    forced.push_back((llama_token) v);
                } catch (const std::exception &) {
                    reply_error("bad token id " + json_string(item));
                    return;
                }
            }
        }
        if (forced.empty()) {
            reply_error("score needs at least one token");
            return;
        }
        std::vector<llama_token> tokens = tokenize_prompt(prompt);
        const size_t n_prompt = tokens.size();
        const size_t n_pos = forced.size();
        // inputs: the prompt and every forced token but the last; outputs from the last prompt token on
        tokens.insert(tokens.end(), forced.begin(), forced.end() - 1);
        if (n_prompt == 0 || (int) tokens.size() > n_ctx) {
            reply_error("prompt plus forced tokens (" + std::to_string(tokens.size()) + ") do not fit the context (" +
                        std::to_string(n_ctx) + " tokens)");
            return;
        }

        FILE * dump = nullptr;
        FILE * ref = nullptr;
        if (dump_path != "-") {
            dump = fopen(dump_path.c_str(), "wb");
            if (!dump) {
                reply_error("cannot write " + dump_path);
                return;
            }
            const int32_t header[2] = { (int32_t) n_pos, (int32_t) n_vocab };
            fwrite(header, sizeof(header), 1, dump);
        }
        if (ref_path != "-") {
            ref = fopen(ref_path.c_str(), "rb");
            int32_t header[2] = { 0, 0 };
            if (!ref || fread(header, sizeof(header), 1, ref) != 1 || header[1] != n_vocab || header[0] < (int32_t) n_pos) {
                if (ref) {
                    fclose(ref);
                }
                if (dump) {
                    fclose(dump);
                }
                reply_error("reference dump " + ref_path + " is missing or does not match (" +
                            std::to_string(n_pos) + " positions of " + std::to_string(n_vocab) + " tokens)");
                return;
            }
        }

        std::vector<float> logprobs(n_vocab);
        std::vector<float> ref_row(n_vocab);
        std::vector<double> kl;
        std::vector<int> agree;
        bool io_ok = true;
        llama_memory_clear(llama_get_memory(ctx), true);
        const bool ok = decode(tokens, 0, n_prompt - 1, [&](int32_t idx, size_t) {
            const float * logits = llama_get_logits_ith(ctx, idx);
            if (!logits) {
                return false;
            }
            const row_facts f = facts_of(logits, n_vocab);
            for (int i = 0; i < n_vocab; i++) {
                logprobs[i] = (float) ((double) logits[i] - f.lse);
            }
            if (dump && fwrite(logprobs.data(), sizeof(float), n_vocab, dump) != (size_t) n_vocab) {
                io_ok = false;
                return false;
            }
            if (ref) {
                if (fread(ref_row.data(), sizeof(float), n_vocab, ref) != (size_t) n_vocab) {
                    io_ok = false;
                    return false;
                }
                double sum = 0.0;
                int ref_top = 0;
                for (int i = 0; i < n_vocab; i++) {
                    const double lp = ref_row[i];
                    if (ref_row[i] > ref_row[ref_top]) {
                        ref_top = i;
                    }
                    sum += std::exp(lp) * (lp - (double) logprobs[i]);
                }
                kl.push_back(sum);
                agree.push_back(ref_top == f.top1 ? 1 : 0);
            }
            return true;
        });
        if (dump) {
            io_ok = fclose(dump) == 0 && io_ok;
        }
        if (ref) {
            fclose(ref);
        }
        if (!ok || !io_ok) {
            reply_error(io_ok ? "llama_process failed while scoring" : "reading or writing a dump failed");
            return;
        }
        std::ostringstream out;
        out << "{\"ok\":true,\"positions\":" << n_pos;
        if (ref) {
            out << ",\"kl\":[";
            for (size_t i = 0; i < kl.size(); i++) {
                out << (i ? "," : "") << json_number(kl[i]);
            }
            out << "],\"top1\":[";
            for (size_t i = 0; i < agree.size(); i++) {
                out << (i ? "," : "") << agree[i];
            }
            out << "]";
        }
        out << ",\"score_ms\":" << json_number(ms_since(t_start)) << "}";
        reply(out.str());
    }

    // the weights the graphs of model m read, into st: a context of its own decodes one token with the eval
    // callback set (see the request's description); "" or what failed
    std::string probe_weights(llama_model * m, probe_state & st) const {
        llama_context_params cparams = common_context_params_to_llama(params);
        cparams.n_ctx = 256;
        cparams.n_batch = 8;
        cparams.n_ubatch = 8;
        cparams.n_seq_max = 1;
        cparams.cb_eval = probe_eval;
        cparams.cb_eval_user_data = &st;
        llama_context * pctx = llama_init_from_model(m, cparams);
        if (pctx == nullptr) {
            return "cannot create a context of its own";
        }
        const llama_vocab * v = llama_model_get_vocab(m);
        llama_token token = llama_vocab_bos(v);
        if (token < 0 || token >= llama_vocab_n_tokens(v)) {
            token = 0;
        }
        llama_batch batch = llama_batch_get_one(&token, 1);
        const bool ok = llama_decode(pctx, batch) == 0;
        llama_free(pctx);
        return ok ? "" : "the decode of one token failed";
    }

    void probe(const std::string & path) {
        const auto t_start = clock_type::now();
        probe_state st;
        const std::string failed = probe_weights(model, st);
        if (!failed.empty()) {
            reply_error("probe: " + failed);
            return;
        }

        const probe_file_map map(params.model.path);
        std::vector<ggml_backend_buffer_t> buffers;
        std::ostringstream out;
        out << "{\"weights\":[";
        for (size_t i = 0; i < st.weights.size(); i++) {
            const ggml_tensor * w = st.weights[i];
            const auto it = std::find(buffers.begin(), buffers.end(), w->buffer);
            const size_t b = (size_t) (it - buffers.begin());
            if (it == buffers.end()) {
                buffers.push_back(w->buffer);
            }
            const bool host = ggml_backend_buffer_is_host(w->buffer);
            out << (i ? "," : "") << "{\"name\":" << json_string(w->name) << ",\"layer\":" << probe_layer(w->name)
                << ",\"type\":" << json_string(ggml_type_name(w->type)) << ",\"bytes\":" << ggml_nbytes(w)
                << ",\"buffer\":" << b << ","
                << probe_memory_json((const char *) w->data, ggml_nbytes(w), host, map) << "}";
        }
        out << "],\"buffers\":[";
        for (size_t b = 0; b < buffers.size(); b++) {
            ggml_backend_buffer_t buf = buffers[b];
            const bool host = ggml_backend_buffer_is_host(buf);
            out << (b ? "," : "") << "{\"name\":" << json_string(ggml_backend_buffer_name(buf))
                << ",\"buffer_type\":" << json_string(ggml_backend_buft_name(ggml_backend_buffer_get_type(buf)))
                << ",\"bytes\":" << ggml_backend_buffer_get_size(buf) << ",\"host\":" << (host ? "true" : "false") << ","
                << probe_memory_json((const char *) ggml_backend_buffer_get_base(buf), ggml_backend_buffer_get_size(buf),
                                     host, map) << "}";
        }
        out << "]," << probe_driver_json() << ",";
        out << "\"file_mappings\":" << map.mappings_json() << ",";
        out << "\"probe_ms\":" << json_number(ms_since(t_start)) << "}\n";
        if (!write_text(path, out.str())) {
            reply_error("probe: cannot write " + path);
            return;
        }
        reply("{\"ok\":true,\"weights\":" + std::to_string(st.weights.size()) + ",\"buffers\":" +
              std::to_string(buffers.size()) + ",\"probe_ms\":" + json_number(ms_since(t_start)) + "}");
    }

    // load, probe and free the model `count` times beside the engine's own load (see the request's description)
    void reload(const std::string & count_text, const std::string & path) {
        const auto t_start = clock_type::now();
        long count = 0;
        try {
            count = std::stol(count_text);
        } catch (const std::exception &) {
        }
        if (count < 1 || count > 100) {
            reply_error("reload needs a count of loads from 1 to 100, not " + json_string(count_text));
            return;
        }
        std::ostringstream out;
        out << "{\"count\":" << count << ",\"baseline\":" << probe_status_json() << ",\"cycles\":[";
        for (long i = 0; i < count; i++) {
            const auto t_load = clock_type::now();
            llama_model * m = llama_model_load_from_file(params.model.path.c_str(), common_model_params_to_llama(params));
            if (m == nullptr) {
                reply_error("reload: load " + std::to_string(i + 1) + " of " + std::to_string(count) + " failed");
                return;
            }
            probe_state st;
            const std::string failed = probe_weights(m, st);
            if (!failed.empty()) {
                llama_model_free(m);
                reply_error("reload: load " + std::to_string(i + 1) + ": " + failed);
                return;
            }
            struct range { const char * base; size_t size; std::string type; bool host; long long locked; };
            std::vector<range> ranges;
            std::set<ggml_backend_buffer_t> seen;
            for (const ggml_tensor * w : st.weights) {
                if (!seen.insert(w->buffer).second) {
                    continue;
                }
                const char * base = (const char *) ggml_backend_buffer_get_base(w->buffer);
                const size_t size = ggml_backend_buffer_get_size(w->buffer);
                const bool host = ggml_backend_buffer_is_host(w->buffer);
                ranges.push_back({ base, size, ggml_backend_buft_name(ggml_backend_buffer_get_type(w->buffer)), host,
                                   host ? probe_page_locked(base, size) : -1 });
            }
            const std::string loaded = probe_status_json();
            const double load_ms = ms_since(t_load);
            llama_model_free(m);
            const std::string freed = probe_status_json();
            out << (i ? "," : "") << "{\"load_ms\":" << json_number(load_ms) << ",\"loaded\":" << loaded
                << ",\"freed\":" << freed << ",\"buffers\":[";
            for (size_t b = 0; b < ranges.size(); b++) {
                const range & r = ranges[b];
                // the freed range asked again: the driver answers for an address it no longer maps too
                const long long left = r.host ? probe_page_locked(r.base, r.size) : -1;
                auto count_json = [](long long v) { return v < 0 ? std::string("null") : std::to_string(v); };
                out << (b ? "," : "") << "{\"buffer_type\":" << json_string(r.type) << ",\"bytes\":" << r.size
                    << ",\"host\":" << (r.host ? "true" : "false") << ",\"page_locked\":" << count_json(r.locked)
                    << ",\"page_locked_after_free\":" << count_json(left) << "}";
            }
            out << "]}";
        }
        out << "]," << probe_driver_json() << ",";
        out << "\"reload_ms\":" << json_number(ms_since(t_start)) << "}\n";
        if (!write_text(path, out.str())) {
            reply_error("reload: cannot write " + path);
            return;
        }
        reply("{\"ok\":true,\"loads\":" + std::to_string(count) + ",\"reload_ms\":" + json_number(ms_since(t_start)) + "}");
    }
};

} // namespace

int main(int argc, char ** argv) {
    std::setlocale(LC_NUMERIC, "C");
#if defined(_WIN32)
    _setmode(_fileno(stdin), _O_BINARY);
    _setmode(_fileno(stdout), _O_BINARY);
#endif
    common_params params;
    common_init();
    if (!common_params_parse(argc, argv, params, LLAMA_EXAMPLE_COMPLETION)) {
        return 1;
    }
    llama_backend_init();
    llama_numa_init(params.numa);

    const auto t_load = clock_type::now();
    auto init = common_init_from_params(params);
    llama_context * ctx = init->context();
    llama_model * model = init->model();
    if (ctx == nullptr || model == nullptr) {
        LOG_ERR("%s: error: unable to load the model or create the context\n", __func__);
        return 1;
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    engine eng{ params, model, ctx, vocab, init->sampler(0), llama_vocab_n_tokens(vocab), (int) llama_n_ctx(ctx) };
    // the model's description as llama_model_desc gives it (llama-bench's model_type) and the CPU threads the
    // context decodes with (llama-bench's n_threads)
    char desc[256];
    llama_model_desc(model, desc, sizeof(desc));
    reply("{\"ok\":true,\"ready\":true,\"n_vocab\":" + std::to_string(eng.n_vocab) + ",\"n_ctx\":" +
          std::to_string(eng.n_ctx) + ",\"model_desc\":" + json_string(desc) + ",\"n_threads\":" +
          std::to_string(llama_n_threads(ctx)) + ",\"load_ms\":" + json_number(ms_since(t_load)) + "}");

    std::string line;
    while (std::getline(std::cin, line)) {
        if (!line.empty() && line.back() == '\r') {
            line.pop_back();
        }
        const std::vector<std::string> parts = split_tabs(line);
        std::string prompt;
        if (parts[0] == "quit") {
            break;
        }
        if (parts[0] == "generate" && parts.size() == 2 && hex_decode(parts[1], prompt)) {
            eng.generate(prompt);
            continue;
        }
        std::string probe_path;
        if (parts[0] == "probe" && parts.size() == 2 && hex_decode(parts[1], probe_path)) {
            eng.probe(probe_path);
            continue;
        }
        if (parts[0] == "reload" && parts.size() == 3 && hex_decode(parts[2], probe_path)) {
            eng.reload(parts[1], probe_path);
            continue;
        }
        if (parts[0] == "bench" && parts.size() == 3) {
            eng.bench(parts[1], parts[2]);
            continue;
        }
        std::string dump_path;
        std::string ref_path;
        if (parts[0] == "score" && parts.size() == 5 && hex_decode(parts[1], prompt) &&
                (parts[3] == "-" || hex_decode(parts[3], dump_path)) && (parts[4] == "-" || hex_decode(parts[4], ref_path))) {
            eng.score(prompt, parts[2], parts[3] == "-" ? "-" : dump_path, parts[4] == "-" ? "-" : ref_path);
            continue;
        }
        reply_error("bad request: " + line.substr(0, 200));
    }
    llama_backend_free();
    return 0;
}
