#include "common/cli/command_line.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/text/suggest.h"

namespace conveyor::cli {
namespace {

// The deepest subcommand the command line chose ("conveyor dump"), or the program.
CLI::App* ChosenCommand(CLI::App* app) {
  for (CLI::App* sub : app->get_subcommands()) return ChosenCommand(sub);
  return app;
}

std::string CommandPath(const CLI::App* app) {
  std::string path = app->get_name();
  for (const CLI::App* p = app->get_parent(); p != nullptr; p = p->get_parent()) path = p->get_name() + " " + path;
  return path;
}

std::vector<std::string> OptionNames(const CLI::App* app) {
  std::vector<std::string> names;
  for (const CLI::Option* opt : app->get_options()) {
    if (!opt->nonpositional()) continue;
    for (const std::string& l : opt->get_lnames()) names.push_back("--" + l);
    for (const std::string& s : opt->get_snames()) names.push_back("-" + s);
  }
  return names;
}

std::vector<std::string> SubcommandNames(const CLI::App* app) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app->get_subcommands([](const CLI::App*) { return true; })) {
    if (!sub->get_name().empty()) names.push_back(sub->get_name());
  }
  return names;
}

// What the extra arguments mean: an unknown command, an unknown option, or a stray value.
std::string DescribeExtras(CLI::App* root, CLI::App* cmd, const std::vector<std::string>& extras) {
  const std::string& first = extras.front();
  if (first.size() > 1 && first[0] == '-') {
    const std::string name = first.substr(0, first.find('='));
    return absl::StrCat("unknown option '", name, "'", DidYouMean(name, OptionNames(cmd)));
  }
  if (cmd == root && !SubcommandNames(root).empty()) {
    return absl::StrCat("unknown command '", first, "'", DidYouMean(first, SubcommandNames(root)),
                        ": expected one of ", absl::StrJoin(SubcommandNames(root), ", "));
  }
  return absl::StrCat("unexpected argument '", first, "'");
}

// The arguments nobody took, wherever CLI11 left them.
std::vector<std::string> Leftovers(CLI::App* app) {
  std::vector<std::string> out = app->remaining(false);
  for (CLI::App* sub : app->get_subcommands()) {
    std::vector<std::string> more = Leftovers(sub);
    out.insert(out.end(), more.begin(), more.end());
  }
  return out;
}

// CLI11 reads an integer option with strtoull/strtoll in base 0: "-3" for an unsigned option
// is 2^64 - 3 (`--epoch-size -3` read for ever), a number past 64 bits is the largest one,
// "010" is 8 and "0x10" is 16. So every integer option (CLI11 names their types UINT and INT)
// is checked first and handed on in one spelling: decimal digits (a '-' first for INT), no
// leading zeros. Decimal-number options (FLOAT) must be finite: a NaN passes every range.
std::string CanonicalInteger(std::string& value, bool is_signed) {
  const bool negative = is_signed && !value.empty() && value[0] == '-';
  const std::string_view digits = std::string_view(value).substr(negative ? 1 : 0);
  const bool all_digits = !digits.empty() && std::all_of(digits.begin(), digits.end(), [](char c) {
    return c >= '0' && c <= '9';
  });
  if (!all_digits) {
    return absl::StrCat("expected a whole number in decimal", is_signed ? "" : " (0, 1, 2, ...)", ", got '", value, "'");
  }
  const size_t first = std::min(digits.find_first_not_of('0'), digits.size() - 1);
  const std::string_view significant = digits.substr(first);
  uint64_t v = 0;
  const auto [at, ec] = std::from_chars(significant.data(), significant.data() + significant.size(), v);
  if (ec == std::errc::result_out_of_range || (is_signed && v > (negative ? uint64_t{1} << 63 : INT64_MAX))) {
    return absl::StrCat("'", value, "' is too large");
  }
  value = (negative && v != 0 ? "-" : "") + std::string(significant);
  return std::string();
}

CLI::Validator WholeNumber(bool is_signed) {
  return CLI::Validator([is_signed](std::string& value) { return CanonicalInteger(value, is_signed); }, "",
                        is_signed ? "integer" : "whole number");
}

CLI::Validator FiniteNumber() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        // As the integers: decimal only (strtod also takes leading spaces and hex).
        const bool plain = !value.empty() && value.find_first_of(" \t\n\v\f\rxXpP") == std::string::npos;
        char* end = nullptr;
        const double v = plain ? std::strtod(value.c_str(), &end) : 0;
        if (!plain || end != value.c_str() + value.size() || !std::isfinite(v)) {
          return absl::StrCat("expected a number, got '", value, "'");
        }
        return std::string();
      },
      "", "number");
}

void CheckNumberOptions(CLI::App* app) {
  for (CLI::Option* opt : app->get_options()) {
    const std::string type = opt->get_type_name();  // "UINT", "INT:INT in [1 - 9]", "FLOAT"
    if (type.rfind("UINT", 0) == 0) opt->transform(WholeNumber(false));  // (a transform: it runs first, and may rewrite)
    else if (type.rfind("INT", 0) == 0) opt->transform(WholeNumber(true));
    else if (type.rfind("FLOAT", 0) == 0) opt->transform(FiniteNumber());
  }
  for (CLI::App* sub : app->get_subcommands([](const CLI::App*) { return true; })) CheckNumberOptions(sub);
}

}  // namespace

std::optional<int> ParseCommandLine(CLI::App& app, int argc, char** argv) {
  CheckNumberOptions(&app);
  try {
    app.parse(argc, argv);
    return std::nullopt;
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    CLI::App* cmd = ChosenCommand(&app);
    std::string what = e.what();
    // A value the checks above let through that does not fit the option's type (a 32-bit one).
    constexpr std::string_view kConvert = "Could not convert: ";
    if (what.rfind(kConvert, 0) == 0) {
      const std::string rest = what.substr(kConvert.size());  // "--rank = 4294967296"
      const size_t eq = rest.find(" = ");
      if (eq != std::string::npos) {
        what = absl::StrCat(rest.substr(0, eq), ": '", rest.substr(eq + 3), "' is out of range");
      }
    }
    const std::vector<std::string> extras = Leftovers(&app);
    if (!extras.empty()) {
      what = DescribeExtras(&app, cmd, extras);
    } else if (cmd == &app && app.get_require_subcommand_min() > 0 && app.get_subcommands().empty()) {
      what = absl::StrCat("a command is required: one of ", absl::StrJoin(SubcommandNames(&app), ", "));
    }
    // CLI11 messages may span lines; a log line must not.
    for (char& c : what) {
      if (c == '\n') c = ' ';
    }
    std::fprintf(stderr, "%s: %s; see '%s --help'\n", CommandPath(cmd).c_str(), what.c_str(), CommandPath(cmd).c_str());
    return kExitUsage;
  }
}

}  // namespace conveyor::cli
