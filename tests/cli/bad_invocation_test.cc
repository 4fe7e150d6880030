// `conveyor` and `conveyord` over a table of bad invocations: missing and unreadable files,
// YAML/JSON/BrainScript syntax errors, wrong types, out-of-range values, unknown keys,
// commands and options, bad addresses and cursors. Each must end with exit status 1 (a
// failure) or 2 (a usage error) and one line on stderr that says what is wrong; never a
// signal, never a hang.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace conveyor::testing {
namespace {

struct Outcome {
  bool signaled = false;
  int signal = 0;
  bool timed_out = false;
  int code = -1;
  std::string err;
};

// Runs `binary` with `args` (no shell), stdout discarded, stderr captured; kills it after
// `timeout`.
Outcome Run(const std::string& binary, const std::vector<std::string>& args, std::chrono::seconds timeout) {
  Outcome o;
  TempDir dir;
  const std::string err_path = dir.path() + "/stderr";
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const int null = ::open("/dev/null", O_RDWR);
    ::dup2(null, 0);
    ::dup2(null, 1);
    ::dup2(err, 2);
    std::vector<char*> argv{const_cast<char*>(binary.c_str())};
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(binary.c_str(), argv.data());
    ::_exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      o.timed_out = true;
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (WIFSIGNALED(status)) {
    o.signaled = true;
    o.signal = WTERMSIG(status);
  } else if (WIFEXITED(status)) {
    o.code = WEXITSTATUS(status);
  }
  o.err = ReadFile(err_path);
  return o;
}

struct Case {
  std::vector<std::string> args;
  int code;              // 1 or 2
  std::string expected;  // a part of the one error line
};

// The lines of `err` that are not warnings (a bad data file may warn before it fails).
std::vector<std::string> ErrorLines(const std::string& err) {
  std::vector<std::string> out;
  for (absl::string_view line : absl::StrSplit(err, '\n', absl::SkipEmpty())) {
    if (!absl::StartsWith(line, "WARNING:")) out.emplace_back(line);
  }
  return out;
}

void Check(const std::string& binary, const std::vector<Case>& cases) {
  for (const Case& c : cases) {
    std::string shown = binary.substr(binary.rfind('/') + 1);
    for (const std::string& a : c.args) shown += " " + a;
    SCOPED_TRACE(shown);
    const Outcome o = Run(binary, c.args, std::chrono::seconds(60));
    ASSERT_FALSE(o.timed_out) << "hung";
    ASSERT_FALSE(o.signaled) << "killed by signal " << o.signal << ": " << o.err;
    EXPECT_EQ(o.code, c.code) << o.err;
    const std::vector<std::string> lines = ErrorLines(o.err);
    ASSERT_EQ(lines.size(), 1u) << o.err;
    EXPECT_NE(lines[0].find(c.expected), std::string::npos) << lines[0];
  }
}

class BadInvocation : public ::testing::Test {
 protected:
  void SetUp() override {
    // One line of error each: gRPC's own log quiet, as the CLI makes it unless asked.
    ::unsetenv("GRPC_VERBOSITY");
    ::unsetenv("GRPC_TRACE");
    examples_ = std::string(CONVEYOR_SOURCE_DIR) + "/examples/conveyor.yaml";
    const std::string ctf = std::string(CONVEYOR_SOURCE_DIR) + "/examples/simple.ctf";
    const std::string good_dataset = "    file: " + ctf + "\n    input: {features: {dim: 2, format: dense}}\n";
    yaml_syntax_ = dir_.Write("syntax.yaml", "datasets:\n  a: [unclosed\n");
    json_syntax_ = dir_.Write("syntax.json", "{\"datasets\": {\"a\": {\"file\": \"x\",}\n");
    brainscript_ = dir_.Write("syntax.cntk", "reader = [\n  readerType = \"CNTKTextFormatReader\"\n  file = \"x.ctf\"\n  input = [ f = [ dim = 2\n");
    wrong_type_ = dir_.Write("type.yaml", "datasets: [1, 2]\n");
    not_bool_ = dir_.Write("bool.yaml", "datasets:\n  a:\n    randomize: maybe\n" + good_dataset);
    range_ = dir_.Write("range.yaml", "datasets:\n  a:\n    chunkSizeInBytes: -5\n" + good_dataset);
    zero_dim_ = dir_.Write("dim.yaml", "datasets:\n  a:\n    file: " + ctf + "\n    input: {features: {dim: 0, format: dense}}\n");
    typo_ = dir_.Write("typo.yaml", "datasets:\n  a:\n    randomise: true\n" + good_dataset);
    top_typo_ = dir_.Write("top.yaml", "dataset:\n  a:\n" + good_dataset);
    server_typo_ = dir_.Write("server.yaml", "server: {parserThread: 2}\ndatasets:\n  a:\n" + good_dataset);
    alias_loop_ = dir_.Write("loop.yaml", "a: &a [*a]\n");
    std::string bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n";
    std::string prev = "a";
    for (int i = 0; i < 9; ++i) {
      const std::string name = "b" + std::to_string(i);
      bomb += name + ": &" + name + " [*" + prev + ", *" + prev + ", *" + prev + ", *" + prev + ", *" + prev +
              ", *" + prev + ", *" + prev + ", *" + prev + ", *" + prev + "]\n";
      prev = name;
    }
    alias_bomb_ = dir_.Write("bomb.yaml", bomb);
    const std::string long_component(300, 'x');
    long_path_ = dir_.Write("long.yaml", "datasets:\n  k:\n    deserializers:\n      - {type: KaldiTable, rspecifier: \"scp:/tmp/" +
                                             long_component + "/feats.scp\", input: {f: {dim: 3}}}\n");
    long_ctf_ = dir_.Write("longctf.yaml", "datasets:\n  a:\n    file: /tmp/" + long_component +
                                               "/a.ctf\n    input: {features: {dim: 2, format: dense}}\n");
    missing_data_ = dir_.Write("missing.yaml", "datasets:\n  a:\n    file: /nonexistent/a.ctf\n    input: {f: {dim: 2, format: dense}}\n");
    not_a_socket_ = dir_.Write("not-a-socket", "");
    // A data file where the configuration goes: small, and larger than a configuration may be.
    std::string big_ctf;
    while (big_ctf.size() <= (1u << 20)) big_ctf += "12 |x 1 2 3 |y 0:1\n";
    big_ctf_ = dir_.Write("big.ctf", big_ctf);
    ::mkdir((dir_.path() + "/adir").c_str(), 0700);
  }

  TempDir dir_;
  std::string big_ctf_;
  std::string examples_, yaml_syntax_, json_syntax_, brainscript_, wrong_type_, not_bool_, range_, zero_dim_, typo_,
      top_typo_, server_typo_, alias_loop_, alias_bomb_, long_path_, long_ctf_, missing_data_, not_a_socket_;
};

TEST_F(BadInvocation, ConveyorEndsWithOneLineAndStatusOneOrTwo) {
  const std::vector<Case> cases = {
      {{}, 2, "a command is required"},
      {{"dumb"}, 2, "unknown command 'dumb' (did you mean 'dump'?)"},
      {{"inspekt", examples_}, 2, "did you mean 'inspect'?"},
      {{"dump"}, 2, "config is required"},
      {{"dump", examples_, "--threadz", "2"}, 2, "unknown option '--threadz' (did you mean '--threads'?)"},
      {{"dump", examples_, "--minibatch-size", "0"}, 2, "--minibatch-size"},
      {{"dump", examples_, "--minibatch-size", "many"}, 2, "--minibatch-size"},
      {{"dump", examples_, "--world", "0"}, 2, "--world"},
      {{"dump", examples_, "extra", "args"}, 2, "unexpected argument"},
      {{"dump", "/nonexistent.yaml"}, 1, "cannot open configuration"},
      {{"dump", dir_.path() + "/adir"}, 1, "adir"},
      {{"inspect", yaml_syntax_}, 1, "syntax.yaml:"},
      {{"inspect", json_syntax_}, 1, "syntax.json:"},
      {{"inspect", brainscript_}, 1, "syntax.cntk:"},
      {{"inspect", wrong_type_}, 1, "expected 'datasets' to map names"},
      {{"inspect", not_bool_}, 1, "expected true or false for 'randomize'"},
      {{"inspect", range_}, 1, "chunkSizeInBytes"},
      {{"inspect", zero_dim_}, 1, "'dim' must be between"},
      {{"inspect", typo_}, 1, "unknown key 'randomise' in dataset 'a' (did you mean 'randomize'?)"},
      {{"inspect", top_typo_}, 1, "(did you mean 'datasets'?)"},
      {{"inspect", server_typo_}, 1, "(did you mean 'parserThreads'?)"},
      {{"inspect", alias_loop_}, 1, "nests deeper than"},
      {{"inspect", alias_bomb_}, 1, "expands to too many values"},
      {{"inspect", long_path_}, 1, "File name too long"},
      {{"dump", long_ctf_}, 1, "File name too long"},
      {{"dump", missing_data_}, 1, "/nonexistent/a.ctf"},
      {{"dump", examples_, "--dataset", "nope"}, 1, "has no dataset 'nope'"},
      {{"dump", std::string(CONVEYOR_SOURCE_DIR) + "/examples/simple.ctf"},
       1,
       "simple.ctf looks like a data file, not a configuration"},
      {{"inspect", big_ctf_}, 1, "configuration is larger than 1048576 bytes (" + big_ctf_ + " looks like a data file"},
      {{"dump", examples_, "--dataset", "simple", "--resume", "garbage"}, 1, "cursor"},
      {{"dump", examples_, "--dataset", "simple", "--resume", "cv1.AAAA"}, 1, "cursor"},
      {{"dump", examples_, "--dataset", "simple", "--randomize", "maybe"}, 2, "--randomize expects on or off"},
      {{"dump", examples_, "--dataset", "sparse", "--layout", "words=diagonal"}, 2, "words"},
      {{"dump", examples_, "--dataset", "sparse", "--layout", "nostream=csr"}, 1, "nostream"},
      {{"dump", examples_, "--dataset", "simple", "--minibatch-mode", "sometimes"}, 2, "--minibatch-mode"},
      // Unsigned options: CLI11 alone reads "-3" as 2^64 - 3 (an epoch that never ends) and a
      // number past 64 bits as 2^64 - 1.
      {{"dump", examples_, "--dataset", "simple", "--epoch-size", "-3"}, 2, "--epoch-size: expected a whole number in decimal (0, 1, 2, ...), got '-3'"},
      {{"dump", examples_, "--dataset", "simple", "--seed", "-5"}, 2, "--seed: expected a whole number"},
      {{"dump", examples_, "--dataset", "simple", "--seed", "99999999999999999999"}, 2, "--seed: '99999999999999999999' is too large"},
      {{"dump", examples_, "--dataset", "simple", "--first-epoch", "0x10"}, 2, "--first-epoch: expected a whole number"},
      {{"dump", examples_, "--dataset", "simple", "--rank", "4294967296", "--world", "2"}, 2, "--rank: '4294967296' is out of range"},
      {{"dump", examples_, "--dataset", "simple", "--threads", "+5"}, 2, "--threads: expected a whole number in decimal, got '+5'"},
      {{"dump", examples_, "--dataset", "simple", "--device", "0x1"}, 2, "--device: expected a whole number"},
      {{"inspect", examples_, "--threads", "-1"}, 2, "--threads"},
      {{"convert", "/nonexistent.ctf", dir_.path() + "/out.cbf", "--config", examples_, "--threads", "-1"}, 2, "--threads"},
      {{"health", "127.0.0.1:1", "--timeout", "nan"}, 2, "--timeout: expected a number, got 'nan'"},
      {{"health", "127.0.0.1:1", "--timeout", "0x1p1"}, 2, "--timeout: expected a number, got '0x1p1'"},
      {{"subscribe", "127.0.0.1:1", "--dataset", "simple", "--keepalive", "inf"}, 2, "--keepalive: expected a number"},
      {{"dump", examples_, "--dataset", "simple", "--first-epoch", "3", "--epochs", "2"}, 2, "--first-epoch 3 must be below --epochs 2"},
      {{"dump", examples_, "--dataset", "simple", "--frame-mode", "--truncation", "5"}, 2, "--frame-mode"},
      {{"bench", "127.0.0.1:1", "--dataset", "simple", "--credits", "65"}, 2, "--credits"},
      {{"subscribe", "127.0.0.1:1", "--dataset", "simple", "--credits", "65"}, 2, "--credits"},
      {{"bench", examples_, "--dataset", "simple", "--credits", "-1"}, 2, "--credits: expected a whole number"},
      {{"dump", examples_, "--dataset", "simple", "--rank", "3", "--world", "2"}, 2, "--rank 3 must be below --world 2"},
      {{"dump", examples_, "--dataset", "simple", "--rank", "1"}, 2, "--rank 1 needs --world"},
      {{"dump", examples_, "--dataset", "simple", "--batch-stride", "2", "--batch-offset", "2"}, 2, "--batch-offset 2 must be below --batch-stride 2"},
      {{"index", examples_, "--threads", "-1"}, 2, "--threads"},
      {{"bench", examples_, "--dataset", "nope"}, 1, "has no dataset 'nope'"},
      {{"convert"}, 2, "is required"},
      {{"convert", "/nonexistent.ctf", dir_.path() + "/out.cbf", "--config", examples_, "--dataset", "simple"},
       1,
       "/nonexistent.ctf"},
      {{"subscribe"}, 2, "is required"},
      {{"subscribe", "127.0.0.1:1", "--dataset", "simple", "--threads", "2"}, 2, "--threads does not apply"},
      {{"subscribe", "127.0.0.1:1", "--dataset", "simple", "--no-reconnect"}, 1, "127.0.0.1:1"},
      {{"subscribe", "127.0.0.1:99999", "--dataset", "simple"}, 1, "99999 is not a TCP port (0 to 65535)"},
      {{"subscribe", "localhost", "--dataset", "simple"}, 2, "'localhost' has no port: write host:port (e.g. localhost:7070)"},
      {{"subscribe", "127.0.0.1:1,[::1]", "--dataset", "simple"}, 2, "'[::1]' has no port"},
      {{"health", "localhost"}, 2, "'localhost' has no port"},
      {{"subscribe", "[::1]:123456", "--dataset", "simple"}, 1, "123456 is not a TCP port"},
      {{"subscribe", "127.0.0.1:1", "--dataset", "simple", "--transport", "carrier-pigeon"}, 2, "transport"},
      {{"subscribe", "127.0.0.1:1", "--dataset", "simple", "--token-file", "/nonexistent"}, 1, "/nonexistent"},
      {{"health"}, 2, "address is required"},
      {{"health", "/nonexistent.sock", "--timeout", "1"}, 1, "does not answer health checks"},
      {{"health", "unix:" + not_a_socket_, "--timeout", "1"}, 1, "does not answer health checks"},
      {{"health", "127.0.0.1:1", "--timeout", "0"}, 2, "--timeout"},
      {{"datasets"}, 2, "address is required"},
      {{"datasets", "localhost"}, 2, "'localhost' has no port"},
      {{"datasets", "127.0.0.1:99999"}, 1, "99999 is not a TCP port"},
      {{"datasets", "127.0.0.1:1", "--token-file", "/nonexistent"}, 1, "/nonexistent"},
      {{"datasets", "127.0.0.1:1"}, 1, "127.0.0.1:1: failed to connect"},
      {{"datasets", "unix:" + not_a_socket_}, 1, "is conveyord running and listening there?"},
      {{"bench", "127.0.0.1:1", "--dataset", "simple", "--token-file", "/nonexistent"}, 1, "/nonexistent"},
      // A socket's path with no socket there: a daemon not running, not a missing configuration.
      {{"bench", dir_.path() + "/gone.sock", "--dataset", "simple"}, 1, "gone.sock: no such socket: a daemon's socket exists while conveyord listens on it"},
      {{"bench", examples_, "--dataset", "simple", "--token-file", "/nonexistent"}, 2, "apply to a daemon's address"},
      {{"health", "127.0.0.1:1,127.0.0.1:2"}, 2, "one daemon address, not a list"},
      {{"datasets", "127.0.0.1:1", "--tls-server-name", "x"}, 2, "--tls-server-name applies to TLS: give --tls-ca too"},
      // An empty --tls-ca would have meant plaintext (the token in clear); an empty token, none.
      {{"datasets", "127.0.0.1:1", "--tls-ca", dir_.Write("empty.pem", "")}, 1, "no PEM certificate in it"},
      {{"subscribe", "127.0.0.1:1", "--dataset", "simple", "--tls-ca", examples_}, 1, "no PEM certificate in it"},
      {{"datasets", "127.0.0.1:1", "--token-file", dir_.Write("empty.token", "\n")}, 1, "empty.token is empty"},
      {{"datasets", "127.0.0.1:"}, 2, "(e.g. 127.0.0.1:7070)"},
  };
  Check(CONVEYOR_BINARY, cases);
}

TEST_F(BadInvocation, ConveyordEndsWithOneLineAndStatusOneOrTwo) {
  const std::string sock = dir_.path() + "/d.sock";
  auto with = [&](std::vector<std::string> args) {
    // Every case listens somewhere harmless, unless it is about the addresses.
    bool listen = false, unix = false;
    for (const std::string& a : args) {
      listen = listen || a == "--listen";
      unix = unix || a == "--unix" || a == "--no-unix";
    }
    if (!listen) args.insert(args.end(), {"--listen", "127.0.0.1:0"});
    if (!unix) args.insert(args.end(), {"--unix", sock});
    return args;
  };
  const std::vector<Case> cases = {
      {with({"--bogus"}), 2, "unknown option '--bogus'"},
      {with({"--parser-thread", "2"}), 2, "(did you mean '--parser-threads'?)"},
      {with({"--parser-threads", "0"}), 2, "--parser-threads"},
      {with({"--parser-threads", "0x10"}), 2, "--parser-threads: expected a whole number in decimal"},
      {with({"--max-subscriptions", "-4"}), 2, "--max-subscriptions"},
      {with({"--assembler", "fpga"}), 2, "--assembler"},
      {with({examples_, "extra"}), 2, "unexpected argument 'extra'"},
      {with({"/nonexistent.yaml"}), 1, "cannot open configuration"},
      {with({yaml_syntax_}), 1, "syntax.yaml:"},
      {with({json_syntax_}), 1, "syntax.json:"},
      {with({brainscript_}), 1, "syntax.cntk:"},
      {with({typo_}), 1, "did you mean 'randomize'?"},
      {with({alias_loop_}), 1, "nests deeper than"},
      {with({alias_bomb_}), 1, "expands to too many values"},
      {with({long_path_}), 1, "File name too long"},
      {with({missing_data_}), 1, "/nonexistent/a.ctf"},
      {with({examples_, "--listen", "nonsense"}), 1, "needs a port"},
      {with({examples_, "--listen", "127.0.0.1:70000"}), 1, "'70000' is not a TCP port (0 to 65535)"},
      {with({examples_, "--listen", "host.invalid:7070"}), 1, "host.invalid:7070"},
      {with({examples_, "--listen", "0.0.0.0:0"}), 1, "without a token"},
      {with({examples_, "--unix-mode", "0666"}), 1, "--unix-mode"},
      {with({examples_, "--token-file", "/nonexistent"}), 1, "/nonexistent"},
      {with({examples_, "--tls-cert", "/nonexistent.pem"}), 1, "TLS needs both"},
      {with({examples_, "--tls-cert", "/nonexistent.pem", "--tls-key", "/nonexistent.key"}), 1, "/nonexistent.pem"},
      {with({examples_, "--unix", not_a_socket_}), 1, "is not a socket"},
      {with({examples_, "--no-unix", "--unix", sock}), 2, "--unix excludes --no-unix"},  // not one ignored
      {with({examples_, "--unix", "/nonexistent-dir/d.sock"}), 1, "/nonexistent-dir/d.sock"},
      {with({examples_, "--metrics", "nonsense"}), 1, "metrics"},
  };
  Check(CONVEYORD_BINARY, cases);
}

}  // namespace
}  // namespace conveyor::testing
