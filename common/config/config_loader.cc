#include "common/config/config_loader.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/config/config_tree.h"
#include "common/config/deserializer_types.h"
#include "common/file_path.h"
#include "common/mapped_file.h"
#include "common/status_macros.h"
#include "common/text/suggest.h"

namespace conveyor {
namespace {

std::string Lower(std::string_view s) { return absl::AsciiStrToLower(absl::string_view(s.data(), s.size())); }

// The keys each block accepts, spelled as documented: what "did you mean" suggests from, and
// what config_test checks every branch of the converter against.
const std::vector<std::string> kTopKeys = {"listen", "tls", "tokenFile", "insecure", "server", "datasets"};
const std::vector<std::string> kTlsKeys = {"cert", "key"};
const std::vector<std::string> kServerKeys = {
    "parserThreads", "parserThreadsPerStream", "maxSubscriptions", "assembler", "cudaDevice",
    "stagingBytes", "minSlotBytes", "slotHeadroom", "unixSocketMode", "subscriptionBytes", "inFlightBytes",
    "chunkCacheBytes"};
const std::vector<std::string> kDatasetKeys = {
    "deserializers", "readerType", "randomize", "randomizationWindow", "sampleBasedRandomizationWindow",
    "randomizationSeed", "frameMode", "truncated", "truncationLength", "maxErrors", "traceLevel", "verbosity",
    "allowPipes", "readMethod", "keepDataInMemory", "cacheIndex", "epochSize", "minibatchMode", "precision",
    "distribution"};
const std::vector<std::string> kDeserializerKeys = {
    "type", "file", "input", "rspecifier", "kind", "allowPipes", "skipSequenceIds", "chunkSizeInBytes",
    "maxErrors", "traceLevel", "module"};
const std::vector<std::string> kStreamKeys = {
    "alias", "dim", "format", "definesMBSize", "scpFile", "mlfFile", "labelMappingFile", "labelDim",
    "frameShift", "contextWindow", "type", "labelType"};

}  // namespace

const ConfigKeys& KnownConfigKeys() {
  static const ConfigKeys* keys =
      new ConfigKeys{kTopKeys, kTlsKeys, kServerKeys, kDatasetKeys, kDeserializerKeys, kStreamKeys};
  return *keys;
}

namespace {

std::vector<std::string> Concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

class Converter {
 public:
  Converter(std::string source, std::string base_dir, bool brainscript, Config* out)
      : source_(std::move(source)), base_dir_(std::move(base_dir)),
        brainscript_(brainscript), out_(out) {}

  absl::Status Error(const ConfigNode& at, const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ":", at.line, ":", at.column, ": ", what));
  }

  // Unknown keys are errors in YAML (they are typos) and warnings in BrainScript, whose
  // reader blocks legitimately carry keys for other CNTK components.
  // `known`: the keys `where` accepts, for a suggestion.
  absl::Status Unknown(const ConfigNode& at, const std::string& key, const std::string& where,
                       const std::vector<std::string>& known) {
    std::string msg = absl::StrCat("unknown key '", key, "' in ", where, DidYouMean(key, known));
    if (brainscript_) {
      out_->warnings.push_back(absl::StrCat(source_, ":", at.line, ":", at.column, ": ", msg, " (ignored)"));
      return absl::OkStatus();
    }
    return Error(at, msg);
  }

  absl::StatusOr<bool> Bool(const ConfigNode& n, const std::string& key) const {
    if (n.kind != ConfigNode::Kind::kScalar) return Error(n, absl::StrCat("expected true or false for '", key, "'"));
    std::string v = Lower(n.scalar);
    if (v == "true" || v == "yes" || v == "on" || v == "1" || v == "auto") return true;
    if (v == "false" || v == "no" || v == "off" || v == "0" || v == "none") return false;
    return Error(n, absl::StrCat("expected true or false for '", key, "', found '", n.scalar, "'"));
  }

  absl::StatusOr<uint64_t> UInt(const ConfigNode& n, const std::string& key, uint64_t min,
                                uint64_t max) const {
    uint64_t v = 0;
    const std::string& s = n.scalar;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (n.kind != ConfigNode::Kind::kScalar || s.empty() || ec != std::errc() ||
        p != s.data() + s.size()) {
      return Error(n, absl::StrCat("expected a non-negative integer for '", key, "', found '", s, "'"));
    }
    if (v < min || v > max) {
      return Error(n, absl::StrCat("'", key, "' must be between ", min, " and ", max, ", found ", v));
    }
    return v;
  }

  // A file mode in octal digits ("0660" or "660"). Only read and write bits for owner and
  // group: a socket others could use would bypass the token.
  absl::StatusOr<int> SocketMode(const ConfigNode& n, const std::string& key) const {
    const std::string& s = n.scalar;
    int mode = 0;
    bool ok = n.kind == ConfigNode::Kind::kScalar && !s.empty() && s.size() <= 4;
    for (char c : s) {
      ok = ok && c >= '0' && c <= '7';
      if (ok) mode = mode * 8 + (c - '0');
    }
    if (!ok) return Error(n, absl::StrCat("expected an octal mode such as 0600 or 0660 for '", key, "', found '", s, "'"));
    if ((mode & ~0660) != 0 || (mode & 0600) != 0600) {
      return Error(n, absl::StrCat("'", key, "' ", s, ": the socket must be readable and writable by its owner, "
                                   "and may be by its group (0600 or 0660); others never (they would bypass the token)"));
    }
    return mode;
  }

  absl::StatusOr<std::string> String(const ConfigNode& n, const std::string& key) const {
    if (n.kind != ConfigNode::Kind::kScalar || n.scalar.empty())
      return Error(n, absl::StrCat("expected a string for '", key, "'"));
    return n.scalar;
  }

  absl::Status Streams(const ConfigNode& input, DeserializerConfig* d) {
    if (!input.is_map() || input.map.empty())
      return Error(input, "expected 'input' to map stream names to {dim, format}");
    std::set<std::string> aliases;
    for (const auto& [name, s] : input.map) {
      if (!s.is_map()) return Error(s, absl::StrCat("expected a block for input '", name, "'"));
      StreamConfig sc;
      sc.name = name;
      bool have_format = false, have_dim = false;
      for (const auto& [k, v] : s.map) {
        const std::string key = Lower(k);
        if (key == "alias") {
          ASSIGN_OR_RETURN(sc.alias, String(v, k));
        } else if (key == "dim") {
          ASSIGN_OR_RETURN(sc.dim, UInt(v, k, 1, kMaxDim));
          have_dim = true;
        } else if (key == "format") {
          std::string f = Lower(v.scalar);
          if (f == "dense") sc.format = StreamFormat::kDense;
          else if (f == "sparse") sc.format = StreamFormat::kSparse;
          else if (f == "ids") sc.format = StreamFormat::kIds;
          else return Error(v, absl::StrCat("expected format dense, sparse or ids for input '", name, "', found '", v.scalar, "'"));
          have_format = true;
        } else if (key == "definesmbsize") {
          ASSIGN_OR_RETURN(sc.defines_mb_size, Bool(v, k));
        } else if (key == "scpfile") {
          ASSIGN_OR_RETURN(std::string f, String(v, k));
          sc.scp_file = JoinPath(base_dir_, f);
        } else if (key == "mlffile") {
          ASSIGN_OR_RETURN(std::string f, String(v, k));
          sc.mlf_file = JoinPath(base_dir_, f);
        } else if (key == "labelmappingfile") {
          ASSIGN_OR_RETURN(std::string f, String(v, k));
          sc.label_mapping_file = JoinPath(base_dir_, f);
        } else if (key == "labeldim") {
          ASSIGN_OR_RETURN(sc.dim, UInt(v, k, 1, kMaxDim));
          have_dim = true;
        } else if (key == "frameshift") {
          ASSIGN_OR_RETURN(sc.frame_shift, UInt(v, k, 1, UINT32_MAX));
        } else if (key == "contextwindow") {
          if (v.kind == ConfigNode::Kind::kList && v.list.size() == 2) {
            ASSIGN_OR_RETURN(uint64_t l, UInt(v.list[0], k, 0, 1000));
            ASSIGN_OR_RETURN(uint64_t r, UInt(v.list[1], k, 0, 1000));
            sc.context_left = static_cast<int>(l);
            sc.context_right = static_cast<int>(r);
          } else {
            ASSIGN_OR_RETURN(uint64_t w, UInt(v, k, 1, 2001));
            if (w % 2 == 0) return Error(v, absl::StrCat("contextWindow ", w, " must be odd (or give [left, right])"));
            sc.context_left = sc.context_right = static_cast<int>(w / 2);
          }
        } else if (key == "type" || key == "labeltype") {
          // CNTK's "real"/"category": what the deserializer already says.
        } else {
          RETURN_IF_ERROR(Unknown(v, k, absl::StrCat("input '", name, "'"), kStreamKeys));
        }
      }
      const bool binary = d->type == "CNTKBinary" || d->type == "KaldiTable";  // the data describes its streams
      if (d->type == "CNTKBinary" && sc.format == StreamFormat::kIds)
        return Error(s, absl::StrCat("input '", name, "': format 'ids' is not available for CNTKBinary"));
      sc.format_given = have_format;
      sc.dim_given = have_dim;
      if (d->type == "HTKFeature" && !have_format) sc.format = StreamFormat::kDense, have_format = true;
      if (d->type == "HTKMLF" && !have_format) sc.format = StreamFormat::kSparse, have_format = true;
      if (!have_format && !binary) return Error(s, absl::StrCat("input '", name, "' needs 'format: dense' or 'format: sparse'"));
      if (!have_dim && sc.format != StreamFormat::kIds && !binary)
        return Error(s, absl::StrCat("input '", name, "' needs 'dim'"));
      if (sc.format == StreamFormat::kIds && d->type == "CNTKTextFormat")
        return Error(s, absl::StrCat("input '", name, "': format 'ids' is not available for CNTKTextFormat (use dense or sparse)"));
      if (sc.alias.empty()) sc.alias = sc.name;
      if (!aliases.insert(sc.alias).second)
        return Error(s, absl::StrCat("alias '", sc.alias, "' is used by two inputs"));
      d->streams.push_back(std::move(sc));
    }
    int defining = 0;
    for (const auto& sc : d->streams) defining += sc.defines_mb_size;
    if (defining > 1)
      return Error(input, "only a single input may set definesMBSize");
    return absl::OkStatus();
  }

  // Dataset-level keys; returns true when `key` was one of them.
  absl::StatusOr<bool> DatasetKey(const std::string& k, const ConfigNode& v, DatasetConfig* ds) {
    const std::string key = Lower(k);
    if (key == "randomize") {
      // HTKMLFReader also takes a window in samples ("17280000": 48 hours of 10 ms frames) and
      // "auto" (the whole corpus), besides true/false/none.
      const std::string r = Lower(v.scalar);
      uint64_t samples = 0;
      const auto [end, ec] = std::from_chars(r.data(), r.data() + r.size(), samples);
      if (v.kind == ConfigNode::Kind::kScalar && ec == std::errc() && end == r.data() + r.size() && samples >= 2) {
        ds->randomize = true;
        ds->randomization_window = samples;
        ds->sample_based_randomization_window = true;
      } else if (v.kind == ConfigNode::Kind::kScalar && r == "auto") {
        ds->randomize = true;
        ds->sample_based_randomization_window = true;  // no window: the whole sweep
      } else {
        ASSIGN_OR_RETURN(ds->randomize, Bool(v, k));
      }
    } else if (key == "randomizationwindow") {
      ASSIGN_OR_RETURN(ds->randomization_window, UInt(v, k, 1, UINT64_MAX));
    } else if (key == "samplebasedrandomizationwindow") {
      ASSIGN_OR_RETURN(ds->sample_based_randomization_window, Bool(v, k));
    } else if (key == "randomizationseed") {
      ASSIGN_OR_RETURN(ds->randomization_seed, UInt(v, k, 0, UINT64_MAX));
    } else if (key == "framemode") {
      ASSIGN_OR_RETURN(ds->frame_mode, Bool(v, k));
    } else if (key == "truncated") {
      ASSIGN_OR_RETURN(ds->truncated, Bool(v, k));
    } else if (key == "truncationlength") {
      ASSIGN_OR_RETURN(ds->truncation_length, UInt(v, k, 0, UINT32_MAX));
    } else if (key == "maxerrors") {
      ASSIGN_OR_RETURN(ds->max_errors, UInt(v, k, 0, UINT64_MAX));
    } else if (key == "tracelevel" || key == "verbosity") {
      ASSIGN_OR_RETURN(uint64_t t, UInt(v, k, 0, 2));
      ds->trace_level = static_cast<int>(t);
    } else if (key == "allowpipes") {
      ASSIGN_OR_RETURN(ds->allow_pipes, Bool(v, k));
    } else if (key == "readmethod") {
      // CNTK's HTKMLFReader: "none" reads in order; blockRandomize/rollingWindow randomize.
      const std::string m = Lower(v.scalar);
      if (m == "none") ds->randomize = false;
      else if (m != "blockrandomize" && m != "rollingwindow")
        return Error(v, absl::StrCat("expected readMethod blockRandomize, rollingWindow or none, found '", v.scalar, "'"));
    } else if (key == "keepdatainmemory") {
      ASSIGN_OR_RETURN(ds->keep_data_in_memory, Bool(v, k));
    } else if (key == "cacheindex") {
      ASSIGN_OR_RETURN(ds->cache_index, Bool(v, k));
    } else if (key == "epochsize") {
      ASSIGN_OR_RETURN(uint64_t e, UInt(v, k, 0, UINT64_MAX));
      if (e > 0) ds->epoch_size = e;  // CNTK: 0 means one sweep
    } else if (key == "distribution") {
      const std::string m = Lower(v.scalar);
      if (m == "balanced") ds->distribution = Distribution::kBalanced;
      else if (m == "chunks") ds->distribution = Distribution::kChunks;
      else return Error(v, absl::StrCat("expected distribution balanced or chunks, found '", v.scalar, "'"));
      distribution_given_ = true;
    } else if (key == "minibatchmode") {
      const std::string m = Lower(v.scalar);
      if (m == "partial") ds->full_minibatches = false;
      else if (m == "full") ds->full_minibatches = true;
      else return Error(v, absl::StrCat("expected minibatchMode partial or full, found '", v.scalar, "'"));
    } else if (key == "precision") {
      std::string p = Lower(v.scalar);
      if (p == "float") ds->precision = Precision::kFloat;
      else if (p == "double") ds->precision = Precision::kDouble;
      else return Error(v, absl::StrCat("expected precision float or double, found '", v.scalar, "'"));
    } else {
      return false;
    }
    return true;
  }

  // Deserializer keys (file, input, ...); the CTF reader block of BrainScript mixes these
  // with dataset keys.
  absl::StatusOr<bool> DeserializerKey(const std::string& k, const ConfigNode& v,
                                       DeserializerConfig* d) {
    const std::string key = Lower(k);
    if (key == "type" || key == "readertype") {
      ASSIGN_OR_RETURN(std::string t, String(v, k));
      const std::string lt = Lower(t);
      if (lt == "cntktextformat" || lt == "cntktextformatreader" || lt == "cntktextformatdeserializer") {
        d->type = "CNTKTextFormat";
      } else if (lt == "cntkbinary" || lt == "cntkbinaryreader" || lt == "cntkbinaryformatdeserializer") {
        d->type = "CNTKBinary";
      } else if (lt == "kalditable") {
        d->type = "KaldiTable";
      } else if (lt == "htkfeature" || lt == "htkfeaturedeserializer") {
        d->type = "HTKFeature";
      } else if (lt == "htkmlf" || lt == "htkmlfdeserializer") {
        d->type = "HTKMLF";
      } else if (lt == "htkmlfreader" || lt == "htkdeserializers") {
        d->type = "HTKMLFReader";  // BrainScript: `features = [...]` and `labels = [...]` blocks
      } else if (std::optional<std::string> registered = FindDeserializerTypeName(t)) {
        d->type = *registered;  // a format registered beyond the built-in ones (formats/registry.h)
      } else {
        return Error(v, absl::StrCat("unknown deserializer type '", t, "' (expected CNTKTextFormat, CNTKBinary, HTKFeature, HTKMLF or KaldiTable)"));
      }
    } else if (key == "file") {
      ASSIGN_OR_RETURN(std::string f, String(v, k));
      d->file = JoinPath(base_dir_, f);
    } else if (key == "input") {
      RETURN_IF_ERROR(Streams(v, d));
    } else if (key == "rspecifier") {
      ASSIGN_OR_RETURN(d->rspecifier, String(v, k));
    } else if (key == "kind") {
      const std::string kind = Lower(v.scalar);
      if (kind == "matrix") d->kaldi_kind = KaldiKind::kMatrix;
      else if (kind == "vector") d->kaldi_kind = KaldiKind::kVector;
      else if (kind == "int32-vector" || kind == "int32vector" || kind == "alignment") d->kaldi_kind = KaldiKind::kInt32Vector;
      else return Error(v, absl::StrCat("expected kind matrix, vector or int32-vector, found '", v.scalar, "'"));
    } else if (key == "allowpipes") {
      ASSIGN_OR_RETURN(bool b, Bool(v, k));
      d->allow_pipes = b;
    } else if (key == "skipsequenceids") {
      ASSIGN_OR_RETURN(d->skip_sequence_ids, Bool(v, k));
    } else if (key == "chunksizeinbytes") {
      ASSIGN_OR_RETURN(d->chunk_size_in_bytes, UInt(v, k, kMinChunkSizeInBytes, UINT64_MAX));
    } else if (key == "maxerrors") {
      ASSIGN_OR_RETURN(d->max_errors, UInt(v, k, 0, UINT64_MAX));
    } else if (key == "tracelevel") {
      ASSIGN_OR_RETURN(uint64_t t, UInt(v, k, 0, 2));
      d->trace_level = static_cast<int>(t);
    } else if (key == "module") {
      // CNTK's plugin name: meaningless here.
    } else {
      return false;
    }
    return true;
  }

  absl::Status FinishDeserializer(const ConfigNode& at, DeserializerConfig* d) {
    if (d->type.empty()) d->type = "CNTKTextFormat";
    d->base_dir = base_dir_;
    if (d->type == "KaldiTable") return FinishKaldi(at, d);
    if (d->type == "HTKFeature" || d->type == "HTKMLF") return FinishHtk(at, d);
    if (!d->rspecifier.empty()) return Error(at, "'rspecifier' belongs to a KaldiTable deserializer (type: KaldiTable)");
    if (d->file.empty()) return Error(at, "the deserializer needs 'file'");
    if (d->streams.empty() && d->type != "CNTKBinary") return Error(at, "the deserializer needs 'input' with at least one stream");
    return absl::OkStatus();
  }

  absl::Status FinishKaldi(const ConfigNode& at, DeserializerConfig* d) {
    if (!d->file.empty()) return Error(at, "a KaldiTable is named by 'rspecifier' (e.g. \"scp:feats.scp\"), not 'file'");
    if (d->rspecifier.empty()) return Error(at, "the KaldiTable deserializer needs 'rspecifier', e.g. \"scp:feats.scp\" or \"ark:ali.ark\"");
    if (d->streams.size() != 1) return Error(at, "a KaldiTable deserializer delivers exactly one stream: give 'input' one entry");
    StreamConfig& sc = d->streams[0];
    if (d->kaldi_kind == KaldiKind::kInt32Vector) {
      if (!sc.format_given) sc.format = StreamFormat::kIds;
      if (sc.format == StreamFormat::kDense)
        return Error(at, absl::StrCat("input '", sc.name, "': int32 vectors are delivered as 'format: ids' or 'format: sparse' (one-hot) with 'dim'"));
      if (sc.format == StreamFormat::kSparse && !sc.dim_given)
        return Error(at, absl::StrCat("input '", sc.name, "': one-hot labels need 'dim' (the number of classes)"));
    } else {
      if (sc.format_given && sc.format != StreamFormat::kDense)
        return Error(at, absl::StrCat("input '", sc.name, "': Kaldi matrices and vectors are dense (format: dense)"));
      sc.format = StreamFormat::kDense;
    }
    sc.format_given = true;
    return absl::OkStatus();
  }

  absl::Status FinishHtk(const ConfigNode& at, DeserializerConfig* d) {
    if (d->streams.empty()) return Error(at, absl::StrCat("the ", d->type, " deserializer needs 'input' with at least one stream"));
    const bool features = d->type == "HTKFeature";
    for (StreamConfig& sc : d->streams) {
      if (features) {
        if (sc.scp_file.empty()) return Error(at, absl::StrCat("input '", sc.name, "' needs 'scpFile' (the list of HTK feature files)"));
        if (sc.format != StreamFormat::kDense) return Error(at, absl::StrCat("input '", sc.name, "': HTK features are dense"));
      } else {
        if (sc.mlf_file.empty()) return Error(at, absl::StrCat("input '", sc.name, "' needs 'mlfFile'"));
        if (sc.format == StreamFormat::kDense) return Error(at, absl::StrCat("input '", sc.name, "': MLF labels are 'sparse' (one-hot) or 'ids'"));
        if (!sc.dim_given) return Error(at, absl::StrCat("input '", sc.name, "' needs 'labelDim' (or 'dim'): the number of classes"));
      }
      sc.format_given = true;
    }
    if (!d->file.empty()) return Error(at, absl::StrCat("the ", d->type, " deserializer reads 'scpFile'/'mlfFile' in its inputs, not 'file'"));
    return absl::OkStatus();
  }

  absl::Status Deserializer(const ConfigNode& n, DatasetConfig* ds) {
    if (!n.is_map()) return Error(n, "expected a deserializer block");
    DeserializerConfig d;
    // `type` first: stream validation depends on it.
    if (const ConfigNode* t = n.Get("type")) RETURN_IF_ERROR(DeserializerKey("type", *t, &d).status());
    for (const auto& [k, v] : n.map) {
      if (absl::EqualsIgnoreCase(k, "type")) continue;
      ASSIGN_OR_RETURN(bool known, DeserializerKey(k, v, &d));
      if (!known) RETURN_IF_ERROR(Unknown(v, k, "deserializer", kDeserializerKeys));
    }
    RETURN_IF_ERROR(FinishDeserializer(n, &d));
    ds->deserializers.push_back(std::move(d));
    return absl::OkStatus();
  }

  // A dataset block: dataset keys plus either `deserializers` or (BrainScript single-reader
  // form) the deserializer keys directly.
  absl::Status Dataset(const std::string& name, const ConfigNode& n, Precision precision) {
    if (!n.is_map()) return Error(n, absl::StrCat("expected a block for dataset '", name, "'"));
    DatasetConfig ds;
    ds.name = name;
    ds.precision = precision;
    distribution_given_ = false;
    DeserializerConfig inline_d;
    std::vector<DeserializerConfig> legacy_htk;
    bool has_inline = false;
    std::string inline_key;  // the first deserializer key given at the dataset's level
    const ConfigNode* inline_at = nullptr;
    const ConfigNode* deserializers = nullptr;
    if (const ConfigNode* t = n.Get("readerType")) {
      RETURN_IF_ERROR(DeserializerKey("readerType", *t, &inline_d).status());
    }
    for (const auto& [k, v] : n.map) {
      if (absl::EqualsIgnoreCase(k, "readerType")) continue;
      if (absl::EqualsIgnoreCase(k, "deserializers")) {
        deserializers = &v;
        continue;
      }
      ASSIGN_OR_RETURN(bool known, DatasetKey(k, v, &ds));
      if (known) continue;
      if (inline_d.type == "HTKMLFReader" && v.is_map() && (v.Get("scpFile") || v.Get("mlfFile"))) {
        // CNTK's HTKMLFReader: each `NAME = [scpFile = ...]` / `NAME = [mlfFile = ...]` block
        // is one stream of an HTK feature or MLF deserializer.
        DeserializerConfig h;
        h.type = v.Get("scpFile") ? "HTKFeature" : "HTKMLF";
        ConfigNode input;
        input.kind = ConfigNode::Kind::kMap;
        input.line = v.line;
        input.column = v.column;
        input.map.emplace_back(k, v);
        RETURN_IF_ERROR(Streams(input, &h));
        RETURN_IF_ERROR(FinishDeserializer(v, &h));
        legacy_htk.push_back(std::move(h));
        continue;
      }
      ASSIGN_OR_RETURN(known, DeserializerKey(k, v, &inline_d));
      if (known) {
        if (!has_inline) {
          inline_key = k;
          inline_at = &v;
        }
        has_inline = true;
        continue;
      }
      RETURN_IF_ERROR(Unknown(v, k, absl::StrCat("dataset '", name, "'"), Concat(kDatasetKeys, kDeserializerKeys)));
    }
    if (inline_d.type == "HTKMLFReader") {
      // CNTK's HTKMLFReader reads frames unless told otherwise (its documentation page,
      // "BrainScript HTKMLF Reader": "Setting frameMode to true is the default"); truncated
      // BPTT implies utterances.
      bool frame_mode_given = false, truncated_given = false;
      for (const auto& [k, v] : n.map) {
        frame_mode_given = frame_mode_given || absl::EqualsIgnoreCase(k, "frameMode");
        truncated_given = truncated_given || absl::EqualsIgnoreCase(k, "truncated");
      }
      if (!frame_mode_given && !(truncated_given && ds.truncated)) ds.frame_mode = true;
      // Feature blocks first: the first one is the primary stream, as in CNTK.
      std::stable_partition(legacy_htk.begin(), legacy_htk.end(), [](const DeserializerConfig& h) { return h.type == "HTKFeature"; });
      if (legacy_htk.empty() || legacy_htk[0].type != "HTKFeature")
        return Error(n, absl::StrCat("dataset '", name, "': an HTKMLFReader needs a features block with 'scpFile'"));
      for (DeserializerConfig& h : legacy_htk) ds.deserializers.push_back(std::move(h));
    } else if (deserializers != nullptr) {
      if (has_inline) {
        return Error(*inline_at, absl::StrCat("dataset '", name, "' has 'deserializers', and '", inline_key,
                                              "' is a deserializer's key: move it into a deserializer's block (or drop "
                                              "'deserializers' and give 'file' and 'input' at the dataset's level)"));
      }
      if (deserializers->kind == ConfigNode::Kind::kList) {
        for (const auto& d : deserializers->list) RETURN_IF_ERROR(Deserializer(d, &ds));
      } else {
        RETURN_IF_ERROR(Deserializer(*deserializers, &ds));
      }
      if (ds.deserializers.empty()) return Error(*deserializers, "expected at least one deserializer");
    } else {
      if (!has_inline) return Error(n, absl::StrCat("dataset '", name, "' needs 'deserializers' (or 'file' and 'input')"));
      RETURN_IF_ERROR(FinishDeserializer(n, &inline_d));
      ds.deserializers.push_back(std::move(inline_d));
    }
    std::set<std::string> names;
    int defining = 0;
    for (const auto& s : ds.AllStreams()) {
      if (!names.insert(s.name).second)
        return Error(n, absl::StrCat("dataset '", name, "' has two streams called '", s.name, "'"));
      defining += s.defines_mb_size;
    }
    if (defining > 1) return Error(n, absl::StrCat("dataset '", name, "': only one stream may set definesMBSize"));
    if (ds.frame_mode && ds.truncated)
      return Error(n, absl::StrCat("dataset '", name, "': frameMode and truncated cannot be combined"));
    if (ds.truncated && ds.truncation_length == 0)
      return Error(n, absl::StrCat("dataset '", name, "': truncated needs a truncationLength > 0"));
    // CNTK's readers split minibatches among workers by chunk: a CNTK configuration keeps that.
    if (brainscript_ && !distribution_given_) ds.distribution = Distribution::kChunks;
    if (out_->Find(name) != nullptr) return Error(n, absl::StrCat("dataset '", name, "' is defined twice"));
    out_->datasets.push_back(std::move(ds));
    return absl::OkStatus();
  }

  absl::Status Yaml(const ConfigNode& root) {
    if (!root.is_map()) return Error(root, "expected a mapping with 'datasets:' at the top");
    for (const auto& [k, v] : root.map) {
      const std::string key = Lower(k);
      if (key == "listen") {
        ASSIGN_OR_RETURN(out_->listen, String(v, k));
      } else if (key == "tls") {
        if (!v.is_map()) return Error(v, "expected 'tls: {cert: FILE, key: FILE}'");
        for (const auto& [tk, tv] : v.map) {
          if (Lower(tk) == "cert") {
            ASSIGN_OR_RETURN(std::string f, String(tv, tk));
            out_->tls_cert = JoinPath(base_dir_, f);
          } else if (Lower(tk) == "key") {
            ASSIGN_OR_RETURN(std::string f, String(tv, tk));
            out_->tls_key = JoinPath(base_dir_, f);
          } else {
            return Error(tv, absl::StrCat("unknown key '", tk, "' in tls (expected cert, key)", DidYouMean(tk, kTlsKeys)));
          }
        }
        if (out_->tls_cert.empty() != out_->tls_key.empty()) return Error(v, "tls needs both cert and key");
      } else if (key == "tokenfile") {
        ASSIGN_OR_RETURN(std::string f, String(v, k));
        out_->token_file = JoinPath(base_dir_, f);
      } else if (key == "insecure") {
        ASSIGN_OR_RETURN(out_->insecure, Bool(v, k));
      } else if (key == "server") {
        if (!v.is_map()) {
          return Error(v, "expected 'server: {parserThreads: N, parserThreadsPerStream: N, maxSubscriptions: N, "
                          "assembler: cpu|cuda, cudaDevice: N, stagingBytes: N, minSlotBytes: N, slotHeadroom: X, "
                          "subscriptionBytes: N, inFlightBytes: N, chunkCacheBytes: N}'");
        }
        for (const auto& [sk, sv] : v.map) {
          const std::string skey = Lower(sk);
          if (skey == "parserthreads") {
            ASSIGN_OR_RETURN(uint64_t n, UInt(sv, sk, 1, 1024));
            out_->server.parser_threads = static_cast<int>(n);
          } else if (skey == "parserthreadsperstream") {
            ASSIGN_OR_RETURN(uint64_t n, UInt(sv, sk, 1, 64));
            out_->server.parser_threads_per_stream = static_cast<int>(n);
          } else if (skey == "maxsubscriptions") {
            ASSIGN_OR_RETURN(uint64_t n, UInt(sv, sk, 1, 65536));
            out_->server.max_subscriptions = n;
          } else if (skey == "assembler") {
            ASSIGN_OR_RETURN(std::string a, String(sv, sk));
            a = Lower(a);
            if (a != "cpu" && a != "cuda") return Error(sv, absl::StrCat("expected assembler cpu or cuda, found '", a, "'"));
            out_->server.assembler = a;
          } else if (skey == "cudadevice") {
            ASSIGN_OR_RETURN(uint64_t n, UInt(sv, sk, 0, 1023));
            out_->server.cuda_device = static_cast<int>(n);
          } else if (skey == "stagingbytes") {
            ASSIGN_OR_RETURN(out_->server.staging_bytes, UInt(sv, sk, uint64_t{1} << 16, uint64_t{1} << 36));
          } else if (skey == "minslotbytes") {
            ASSIGN_OR_RETURN(out_->server.min_slot_bytes, UInt(sv, sk, 256, uint64_t{1} << 36));
          } else if (skey == "unixsocketmode") {
            ASSIGN_OR_RETURN(out_->server.unix_socket_mode, SocketMode(sv, sk));
          } else if (skey == "slotheadroom") {
            char* end = nullptr;
            const double h = sv.kind == ConfigNode::Kind::kScalar ? std::strtod(sv.scalar.c_str(), &end) : 0;
            if (end == nullptr || *end != 0 || sv.scalar.empty() || !(h >= 1 && h <= 16)) {
              return Error(sv, absl::StrCat("expected a number from 1 to 16 for 'slotHeadroom', found '", sv.scalar, "'"));
            }
            out_->server.slot_headroom = h;
          } else if (skey == "subscriptionbytes") {  // memory budgets (docs/design.md section 9)
            ASSIGN_OR_RETURN(out_->server.subscription_bytes, UInt(sv, sk, uint64_t{1} << 20, uint64_t{1} << 40));
          } else if (skey == "inflightbytes") {
            ASSIGN_OR_RETURN(out_->server.in_flight_bytes, UInt(sv, sk, uint64_t{1} << 20, uint64_t{1} << 44));
          } else if (skey == "chunkcachebytes") {
            ASSIGN_OR_RETURN(out_->server.chunk_cache_bytes, UInt(sv, sk, uint64_t{1} << 20, uint64_t{1} << 44));
          } else {
            return Error(sv, absl::StrCat("unknown key '", sk, "' in server", DidYouMean(sk, kServerKeys),
                                          ": expected one of ", absl::StrJoin(kServerKeys, ", ")));
          }
        }
      } else if (key == "datasets") {
        if (!v.is_map() || v.map.empty()) return Error(v, "expected 'datasets' to map names to dataset blocks");
        for (const auto& [name, ds] : v.map) RETURN_IF_ERROR(Dataset(name, ds, Precision::kFloat));
      } else {
        return Error(v, absl::StrCat("unknown top-level key '", k, "'", DidYouMean(k, kTopKeys),
                                      ": expected one of ", absl::StrJoin(kTopKeys, ", ")));
      }
    }
    if (out_->datasets.empty()) return Error(root, "the configuration defines no dataset ('datasets:' is missing)");
    return absl::OkStatus();
  }

  absl::StatusOr<Precision> PrecisionOf(const ConfigNode& block, Precision dflt) const {
    const ConfigNode* p = block.Get("precision");
    if (p == nullptr) return dflt;
    std::string v = Lower(p->scalar);
    if (v == "float") return Precision::kFloat;
    if (v == "double") return Precision::kDouble;
    return Error(*p, absl::StrCat("expected precision float or double, found '", p->scalar, "'"));
  }

  absl::Status BrainScript(const ConfigNode& root) {
    ASSIGN_OR_RETURN(Precision top, PrecisionOf(root, Precision::kFloat));
    for (const auto& [k, v] : root.map) {
      if (!v.is_map()) continue;
      if (absl::EqualsIgnoreCase(k, "reader")) {
        RETURN_IF_ERROR(Dataset("reader", v, top));
      } else if (const ConfigNode* reader = v.Get("reader"); reader != nullptr && reader->is_map()) {
        ASSIGN_OR_RETURN(Precision p, PrecisionOf(v, top));
        RETURN_IF_ERROR(Dataset(k, *reader, p));
      }
    }
    if (out_->datasets.empty())
      return Error(root, "no 'reader = [ ... ]' block found (expected a CNTK reader section)");
    return absl::OkStatus();
  }

 private:
  const std::string source_;
  const std::string base_dir_;
  const bool brainscript_;
  Config* const out_;
  bool distribution_given_ = false;  // the dataset being converted names its distribution
};

}  // namespace

absl::StatusOr<Config> ParseConfig(std::string_view text, const std::string& source,
                                   const std::string& base_dir) {
  if (text.size() > kMaxConfigBytes)
    return absl::InvalidArgumentError(absl::StrCat(source, ": configuration is larger than ", kMaxConfigBytes, " bytes"));
  // Nesting is bounded before any recursive parser sees the text.
  int depth = 0, max_depth = 0;
  char quote = 0;
  for (char c : text) {
    if (quote) {
      if (c == quote || c == '\n') quote = 0;
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '[' || c == '{' || c == '(') {
      max_depth = std::max(max_depth, ++depth);
    } else if (c == ']' || c == '}' || c == ')') {
      depth = std::max(0, depth - 1);
    }
  }
  if (max_depth > kMaxConfigNesting) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": configuration nests deeper than ", kMaxConfigNesting, " levels"));
  }
  Config config;
  config.source = source;
  const bool bs = LooksLikeBrainScript(text);
  ConfigNode root;
  if (bs) {
    ASSIGN_OR_RETURN(root, ParseBrainScript(text, source));
  } else {
    ASSIGN_OR_RETURN(root, ParseYamlConfig(text, source));
  }
  Converter conv(source, base_dir, bs, &config);
  if (bs) {
    RETURN_IF_ERROR(conv.BrainScript(root));
  } else {
    RETURN_IF_ERROR(conv.Yaml(root));
  }
  return config;
}

namespace {

// Whether `head` (a file's first bytes) looks like a data file given where a configuration
// was expected: binary bytes (CBF, a Kaldi ark, HTK features), or CTF text ('|' fields).
bool LooksLikeData(std::string_view head) {
  head = head.substr(0, 4096);
  if (head.find('\0') != std::string_view::npos) return true;
  const std::string_view line = head.substr(0, head.find('\n'));
  const size_t bar = line.find('|');
  if (bar == std::string_view::npos) return false;
  for (char c : line.substr(0, bar)) {  // "|x ..." or "12 |x ...": a sequence id before it at most
    if (!(c == ' ' || c == '\t' || (c >= '0' && c <= '9') || c == '\xEF' || c == '\xBB' || c == '\xBF')) return false;
  }
  return true;
}

std::string DataFileHint(const std::string& path) {
  return absl::StrCat(" (", path, " looks like a data file, not a configuration: give the YAML (or CNTK reader ",
                      "block) that names it, e.g. conveyor dump examples/conveyor.yaml --dataset simple)");
}

}  // namespace

absl::StatusOr<Config> LoadConfigFile(const std::string& path) {
  // A data file given where the configuration goes is not read whole to say so.
  auto stamp = StatFile(path);
  if (stamp.ok() && stamp->size > kMaxConfigBytes) {
    std::string head;
    auto file = MappedFile::Open(path);
    if (file.ok()) head = std::string((*file)->bytes().substr(0, 4096));
    return absl::InvalidArgumentError(absl::StrCat(path, ": configuration is larger than ", kMaxConfigBytes, " bytes",
                                                   LooksLikeData(head) ? DataFileHint(path) : std::string()));
  }
  auto text = ReadFileToString(path);
  if (!text.ok()) {
    // "PATH: cannot open: why" -> "PATH: cannot open configuration: why"
    return absl::Status(text.status().code(),
                        absl::StrReplaceAll(text.status().message(), {{": cannot open:", ": cannot open configuration:"},
                                                                      {": cannot read:", ": cannot read configuration:"}}));
  }
  std::string dir;
  size_t slash = path.rfind('/');
  if (slash != std::string::npos) dir = path.substr(0, slash + 1);
  auto config = ParseConfig(*text, path, dir);
  if (!config.ok() && LooksLikeData(*text)) {
    return absl::Status(config.status().code(), absl::StrCat(config.status().message(), DataFileHint(path)));
  }
  return config;
}

}  // namespace conveyor
