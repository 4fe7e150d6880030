// conveyor inspect: what a dataset holds, and what is wrong with it.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/batch/dump_writer.h"
#include "absl/strings/str_format.h"
#include "client/cli/commands.h"
#include "client/cli/common_options.h"
#include "client/cli/progress.h"
#include "common/sampling/chunk_pipeline.h"

namespace conveyor::cli {
namespace {


struct InspectArgs {
  std::string config;
  std::string dataset;
  int threads = 0;
  bool json = false;
};

struct StreamTotals {
  uint64_t samples = 0, nnz = 0, sequences_with_samples = 0;
};

// What a full parse of one dataset found.
struct DatasetReport {
  std::vector<StreamTotals> totals;  // per stream
  uint64_t good_sequences = 0;       // sequences parsed without an error
  uint64_t errors = 0;               // input errors
};

// The datasets to inspect: the one named, or all of them.
absl::StatusOr<std::vector<DatasetConfig>> ChooseTargets(const Config& config, const std::string& name) {
  if (name.empty()) return config.datasets;
  auto d = ChooseDataset(config, name);
  if (!d.ok()) return d.status();
  return std::vector<DatasetConfig>{*d};
}

// Opens (indexes) `dc` with an error budget no input breaks: inspect counts every error.
absl::StatusOr<std::unique_ptr<Dataset>> OpenCountingErrors(const DatasetConfig& dc, int threads) {
  DatasetOpenOptions options;
  options.index_threads = threads;
  options.max_errors_override = UINT64_MAX;  // count every error, stop at none
  ProgressBar index_bar("indexing");
  options.progress = [&](uint64_t d, uint64_t t) { index_bar.Update(d, t); };
  auto ds = Dataset::Open(dc, options);
  index_bar.Finish();
  return ds;
}

// Parses every chunk of `ds` once (the only way to count samples per stream and input
// errors) into report->totals and report->good_sequences. Returns 0, or the exit status
// after printing the error (printed while the pipeline and its progress bar still run).
int ParseEveryChunk(Dataset* ds, int threads, DatasetReport* report) {
  const Index& index = ds->index();
  std::vector<StreamTotals>& totals = report->totals;
  totals.resize(ds->streams().size());
  ChunkPipelineOptions po;
  po.threads = threads;
  po.prefetch = 2 * threads;
  po.consumer_parses = true;  // this thread is one of `threads`, as in bench and dump
  ChunkPipeline pipeline(ds, po);
  ProgressBar bar("parsing");
  const uint64_t n = index.chunks.size();
  uint64_t next = 0;
  for (uint64_t c = 0; c < n; ++c) {
    while (next < n && next < c + static_cast<uint64_t>(po.prefetch) + 1) pipeline.Enqueue(next++);
    auto chunk = pipeline.Get(c);
    if (!chunk.ok()) return Fail(chunk.status());
    report->good_sequences += (*chunk)->num_sequences();
    for (size_t s = 0; s < totals.size(); ++s) {
      const ParsedStream& ps = (*chunk)->streams[s];
      totals[s].samples += ps.total_samples();
      if (ps.format == StreamFormat::kSparse) totals[s].nnz += ps.total_entries();
      for (uint64_t q = 0; q < (*chunk)->num_sequences(); ++q)
        totals[s].sequences_with_samples += ps.num_samples(q) > 0;
    }
    pipeline.Release(c);
    bar.Update(index.chunks[c].end_offset, ds->file_bytes());
  }
  return 0;
}

// Appends the dataset's JSON object to `json`, an array being written.
void AppendJsonReport(const DatasetConfig& dc, const Dataset& ds, const DatasetReport& report, std::string* json) {
  const Index& index = ds.index();
  const DeserializerConfig& d = dc.deserializers[0];
  if (json->size() > 1) *json += ",";
  absl::StrAppend(json, "{\"dataset\":\"", dc.name, "\",\"type\":\"", d.type, "\",\"file\":\"", JsonEscape(ds.path()),
                  "\",\"bytes\":", ds.file_bytes(), ",\"chunks\":", index.chunks.size(),
                  ",\"sequences\":", index.sequences.size(), ",\"valid_sequences\":", report.good_sequences,
                  ",\"samples\":", index.total_samples, ",\"errors\":", report.errors,
                  ",\"max_errors\":", dc.EffectiveMaxErrors());
  if (!ds.source_stats().empty()) {
    *json += ",\"deserializers\":[";
    for (size_t k = 0; k < ds.source_stats().size(); ++k) {
      const SourceStats& st = ds.source_stats()[k];
      absl::StrAppend(json, k ? "," : "", "{\"type\":\"", st.type, "\",\"source\":\"", JsonEscape(st.description),
                      "\",\"entries\":", st.entries, ",\"skipped\":", st.skipped, ",\"missing\":", st.missing,
                      ",\"duplicates\":", st.duplicates, "}");
    }
    absl::StrAppend(json, "],\"dropped_empty\":", ds.dropped_empty(), ",\"dropped_mismatched\":",
                    ds.dropped_mismatched());
  }
  *json += ",\"streams\":[";
  for (size_t s = 0; s < report.totals.size(); ++s) {
    const StreamConfig& sc = ds.streams()[s];
    absl::StrAppend(json, s ? "," : "", "{\"name\":\"", sc.name, "\",\"alias\":\"", sc.alias,
                    "\",\"format\":\"", StreamFormatName(sc.format), "\",\"dim\":", sc.dim,
                    ",\"definesMBSize\":", sc.defines_mb_size ? "true" : "false",
                    ",\"samples\":", report.totals[s].samples, ",\"nnz\":", report.totals[s].nnz, "}");
  }
  *json += "]}";
}

// The text report's deserializer lines: one for a single file, else one per source, then
// the input's size and the sequences joining dropped.
void PrintTextSources(const DatasetConfig& dc, const Dataset& ds) {
  const DeserializerConfig& d = dc.deserializers[0];
  if (ds.source_stats().empty()) {
    std::printf("  deserializer  %s  %s (%s bytes)\n", d.type.c_str(), d.file.c_str(),
                absl::StrFormat("%d", ds.file_bytes()).c_str());
    return;
  }
  for (size_t k = 0; k < ds.source_stats().size(); ++k) {
    const SourceStats& st = ds.source_stats()[k];
    std::printf("  deserializer  %s  %s%s: %llu entries", st.type.c_str(), st.description.c_str(),
                k == 0 && ds.source_stats().size() > 1 ? " (primary)" : "",
                static_cast<unsigned long long>(st.entries));
    if (st.skipped) std::printf(", %llu unreadable skipped", static_cast<unsigned long long>(st.skipped));
    if (k > 0) std::printf(", %llu keys of the primary missing", static_cast<unsigned long long>(st.missing));
    if (st.duplicates) std::printf(", %llu repeated keys", static_cast<unsigned long long>(st.duplicates));
    std::printf("\n");
  }
  std::printf("  input         %s bytes\n", absl::StrFormat("%d", ds.file_bytes()).c_str());
  if (ds.dropped_empty() || ds.dropped_mismatched()) {
    std::printf("  not delivered %llu sequences with no samples, %llu with streams of different lengths (frame mode)\n",
                static_cast<unsigned long long>(ds.dropped_empty()),
                static_cast<unsigned long long>(ds.dropped_mismatched()));
  }
}

// The text report's stream lines, and the errors line.
void PrintTextStreamsAndErrors(const DatasetConfig& dc, const Dataset& ds, const DatasetReport& report) {
  const Index& index = ds.index();
  std::printf("  streams\n");
  for (size_t s = 0; s < report.totals.size(); ++s) {
    const StreamConfig& sc = ds.streams()[s];
    std::printf("    %-16s alias %-8s %-6s dim %-8llu samples %llu", sc.name.c_str(), sc.alias.c_str(),
                StreamFormatName(sc.format), static_cast<unsigned long long>(sc.dim),
                static_cast<unsigned long long>(report.totals[s].samples));
    if (sc.format == StreamFormat::kSparse)
      std::printf("  nnz %llu", static_cast<unsigned long long>(report.totals[s].nnz));
    if (sc.defines_mb_size) std::printf("  (defines the minibatch size)");
    std::printf("\n");
  }
  if (report.errors == 0) {
    std::printf("  errors        none\n");
  } else {
    std::printf("  errors        %llu input errors (%llu of %zu sequences skipped); with maxErrors=%llu "
                "reading %s\n",
                static_cast<unsigned long long>(report.errors),
                static_cast<unsigned long long>(index.sequences.size() - report.good_sequences),
                index.sequences.size(), static_cast<unsigned long long>(dc.EffectiveMaxErrors()),
                report.errors > dc.EffectiveMaxErrors() ? "stops at the error that breaks the budget"
                                                        : "skips them");
  }
}

// The dataset's text report on stdout.
void PrintTextReport(const DatasetConfig& dc, const Dataset& ds, const DatasetReport& report) {
  const Index& index = ds.index();
  const DeserializerConfig& d = dc.deserializers[0];
  std::printf("dataset %s\n", dc.name.c_str());
  PrintTextSources(dc, ds);
  std::printf("  precision     %s   randomize %s   frameMode %s   maxErrors %llu\n",
              dc.precision == Precision::kFloat ? "float" : "double", dc.randomize ? "true" : "false",
              dc.frame_mode ? "true" : "false", static_cast<unsigned long long>(dc.EffectiveMaxErrors()));
  std::printf("  chunks        %zu (chunkSizeInBytes %llu)\n", index.chunks.size(),
              static_cast<unsigned long long>(d.chunk_size_in_bytes));
  std::printf("  sequences     %zu%s\n", index.sequences.size(),
              !index.names.empty() ? (d.type == "CNTKTextFormat" || d.type == "CNTKBinary" ? " (joined by sequence id)"
                                                                                         : " (keyed by utterance id)")
              : index.keys_are_line_numbers ? " (keyed by line number)" : " (keyed by sequence id)");
  std::printf("  samples       %llu\n", static_cast<unsigned long long>(index.total_samples));
  PrintTextStreamsAndErrors(dc, ds, report);
}

int RunInspect(const InspectArgs& args) {
  auto config = LoadConfig(args.config);
  if (!config.ok()) return Fail(config.status());
  auto targets = ChooseTargets(*config, args.dataset);
  if (!targets.ok()) return Fail(targets.status());
  const int threads = args.threads > 0 ? args.threads : 2;
  std::string json = "[";
  uint64_t total_errors = 0;
  for (const DatasetConfig& dc : *targets) {
    auto ds = OpenCountingErrors(dc, threads);
    if (!ds.ok()) return Fail(ds.status());
    DatasetReport report;
    if (const int status = ParseEveryChunk(ds->get(), threads, &report); status != 0) return status;
    (*ds)->diagnostics().Flush();
    report.errors = (*ds)->errors();
    total_errors += report.errors;
    if (args.json) {
      AppendJsonReport(dc, **ds, report, &json);
    } else {
      PrintTextReport(dc, **ds, report);
    }
  }
  if (args.json) std::printf("%s]\n", json.c_str());
  if (total_errors > 0) {
    // A script (or CI over a dataset) learns of bad data from the status, not by parsing text.
    std::fprintf(stderr, "conveyor inspect: %llu input error(s) found\n", static_cast<unsigned long long>(total_errors));
    return 1;
  }
  return 0;
}

}  // namespace

void RegisterInspect(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<InspectArgs>();
  CLI::App* cmd = app.add_subcommand(
      "inspect",
      "Show a dataset's streams (name, alias, format, dim), its chunks, sequences and samples, "
      "and every input error found, after a full parse. Inspect never stops at an error: it "
      "counts them all and says what maxErrors would do. Exit status 1 when it found any.");
  cmd->add_option("config", args->config, "Configuration file (YAML, JSON or a CNTK reader block)")->required();
  cmd->add_option("--dataset", args->dataset, "Dataset to inspect (default: all of them)");
  cmd->add_option("--threads", args->threads, "Threads for indexing and parsing (default 2)")->check(CLI::Range(0, 256));
  cmd->add_flag("--json", args->json, "Print one JSON array instead of text");
  cmd->callback([args, exit_code] { *exit_code = RunInspect(*args); });
}

}  // namespace conveyor::cli
