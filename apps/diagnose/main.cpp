// seqpar-diagnose: what went wrong in a user's own sequence-parallel run, from the
// tensors each rank saved. See apps/diagnose/README.md.
//
// Reading order: inputs.h (what is read and how it is checked), diagnosis.h (the
// figures and verdicts), figures.cpp, verdict.cpp (which pitfall the figures point
// to), report.cpp.
#include <sys/stat.h>

#include <iostream>
#include <sstream>

#include "apps/common/text.h"
#include "apps/diagnose/report.h"
#include "apps/diagnose/settings.h"
#include "apps/common/command_line.h"
#include "core/error.h"
#include "apps/common/output_file.h"
#include "seqpar/version.h"

namespace seqpar::diagnose {
namespace {

const char* const kUsage =
    "usage: seqpar-diagnose --ranks FILES [--grads FILES] [--optimizer FILES]\n"
    "                       [--baseline FILE]... [--initial FILE]\n"
    "                       [--ds-config FILE] [--lr LR] [--betas B1,B2] [--eps EPS]\n"
    "                       [--weight-decay WD] [--gradient-clipping MAX] [--sp N]\n"
    "                       [--dp N] [--precision bf16|fp16|tf32|fp32|fp64]\n"
    "                       [--tokens N] [--attention-layout LAYOUT] [--json FILE|-]\n"
    "                       [--help] [--version]\n"
    "\n"
    "Reads the tensors each rank of a sequence-parallel run saved (safetensors; FILES is a\n"
    "file or a quoted glob such as 'model_rank*.safetensors', repeatable; the last number\n"
    "in a file's name is its rank) and says whether the ranks agree, and if not, which of\n"
    "the known pitfalls the numbers show, with its fix and the seqpar-repro scenario that\n"
    "reproduces it. Names: PARAM (after the step), grad.PARAM, local_grad.PARAM,\n"
    "exp_avg.PARAM, exp_avg_sq.PARAM, clip_norm; attention (attention.query, attention.key)\n"
    "for the Ulysses signatures. --baseline: the one-rank training, one\n"
    "process on the whole batch (--reference is its old name). --initial: the parameters\n"
    "before the first step. Every rounding tolerance derives from the run's precision: the\n"
    "saved dtypes and the ds_config's bf16/fp16, or --precision; --tokens: the batch's\n"
    "tokens, the length of a weight gradient's sum. --attention-layout tokens-first\n"
    "([S/sp, ...], DeepSpeed's [s, b, h, d]), batch-first ([b, S/sp, h*d]) or head-sharded\n"
    "([S, H/sp*D]): only where the shapes fit two. Exit status 0 whatever the verdict,\n"
    "2 for bad input. See\n"
    "apps/diagnose/README.md.\n";

struct Options {
  FileLists files;
  SettingFlags settings;
  std::string json_path;
  bool help = false, version = false;
};

std::pair<double, double> parse_betas(const std::string& text) {
  const size_t comma = text.find(',');
  SEQPAR_INPUT_CHECK(comma != std::string::npos, "--betas '", text, "': expected B1,B2 (0.9,0.999)");
  const double b1 = parse_number_option("--betas", text.substr(0, comma));
  const double b2 = parse_number_option("--betas", text.substr(comma + 1));
  SEQPAR_INPUT_CHECK(b1 >= 0 && b1 < 1 && b2 >= 0 && b2 < 1, "--betas '", text, "': each must be in [0, 1)");
  return {b1, b2};
}

double positive(const std::string& option, const std::string& text) {
  const double value = parse_number_option(option, text);
  SEQPAR_INPUT_CHECK(value > 0 && value <= 1, option, " ", text, ": expected a number in (0, 1]");
  return value;
}

// The options that take files: a second file after one of them is a glob the shell
// expanded, which the parser would call an unexpected argument.
void refuse_unquoted_glob(const std::vector<std::string>& arguments) {
  for (size_t i = 0; i + 2 < arguments.size(); ++i) {
    const std::string& option = arguments[i];
    const bool takes_files = option == "--ranks" || option == "--grads" || option == "--optimizer" ||
                             option == "--baseline" || option == "--reference";
    if (!takes_files || arguments[i + 2].empty() || arguments[i + 2][0] == '-') continue;
    SEQPAR_INPUT_FAIL(option, " ", arguments[i + 1], " ", arguments[i + 2],
                      ": several files after one ", option, ", as the shell expands an unquoted glob: "
                      "quote the glob (", option, " 'model_rank*.safetensors') or repeat ", option, " per file");
  }
}

// An output never names an input: --json onto any file read (the same file through
// any link) is refused before any work.
void refuse_output_onto_input(const std::string& output, const FileLists& files, const std::string& ds_config) {
  struct stat out {};
  if (output.empty() || output == "-" || ::stat(output.c_str(), &out) != 0) return;
  std::vector<std::pair<std::string, std::string>> inputs = input_files(files);
  if (!ds_config.empty()) inputs.emplace_back("--ds-config", ds_config);
  for (const auto& [option, path] : inputs) {
    struct stat in {};
    if (::stat(path.c_str(), &in) != 0) continue;
    SEQPAR_INPUT_CHECK(in.st_dev != out.st_dev || in.st_ino != out.st_ino, "--json ", output, ": is the ",
                       option, " file ", path, "; the report would overwrite it: name another file");
  }
}

Options parse_options(const std::vector<std::string>& arguments) {
  refuse_unquoted_glob(arguments);
  Options o;
  const auto list = [](const char* name, std::vector<std::string>& target) {
    return CommandLineOption{{name}, true, [&target](const std::string& v) { target.push_back(v); }};
  };
  const auto text = [](const char* name, std::string& target) {
    return CommandLineOption{{name}, true, [&target](const std::string& v) { target = v; }};
  };
  parse_command_line(arguments, {
      {{"--help", "-h"}, false, [&](const std::string&) { o.help = true; }},
      {{"--version"}, false, [&](const std::string&) { o.version = true; }},
      list("--ranks", o.files.ranks), list("--grads", o.files.grads), list("--optimizer", o.files.optimizer),
      // --reference: the baseline's old name, still accepted.
      list("--baseline", o.files.baseline), list("--reference", o.files.baseline), text("--initial", o.files.initial),
      text("--ds-config", o.settings.ds_config), text("--json", o.json_path),
      {{"--lr"}, true, [&](const std::string& v) { o.settings.lr = positive("--lr", v); }},
      {{"--eps"}, true, [&](const std::string& v) { o.settings.eps = positive("--eps", v); }},
      {{"--weight-decay"}, true, [&](const std::string& v) {
         o.settings.weight_decay = parse_number_option("--weight-decay", v);
         SEQPAR_INPUT_CHECK(*o.settings.weight_decay >= 0, "--weight-decay ", v, ": must not be negative");
       }},
      {{"--gradient-clipping"}, true, [&](const std::string& v) {
         o.settings.clipping = parse_number_option("--gradient-clipping", v);
         SEQPAR_INPUT_CHECK(*o.settings.clipping >= 0, "--gradient-clipping ", v, ": must not be negative");
       }},
      {{"--betas"}, true, [&](const std::string& v) { std::tie(o.settings.beta1, o.settings.beta2) = parse_betas(v); }},
      {{"--sp"}, true, [&](const std::string& v) { o.settings.sp = int(parse_integer_option("--sp", v, 1, 1 << 16)); }},
      {{"--dp"}, true, [&](const std::string& v) { o.settings.dp = int(parse_integer_option("--dp", v, 1, 1 << 16)); }},
      {{"--precision"}, true, [&](const std::string& v) {
         o.settings.precision = parse_precision(v);
         SEQPAR_INPUT_CHECK(o.settings.precision, "--precision '", v, "': expected bf16, fp16, tf32, fp32 or fp64");
       }},
      {{"--attention-layout"}, true, [&](const std::string& v) {
         o.settings.attention_layout = parse_attention_layout(v);
         SEQPAR_INPUT_CHECK(o.settings.attention_layout, "--attention-layout '", v,
                            "': expected tokens-first, batch-first or head-sharded");
       }},
      {{"--tokens"}, true, [&](const std::string& v) {
         o.settings.tokens = parse_integer_option("--tokens", v, 1, int64_t(1) << 40);
       }},
  });
  return o;
}

int run(int argc, char** argv) {
  const Options options = parse_options(std::vector<std::string>(argv + 1, argv + argc));
  if (options.help) {
    std::cout << kUsage;
    return 0;
  }
  if (options.version) {
    std::cout << "seqpar-diagnose " << kSeqparVersion << '\n';
    return 0;
  }
  if (!options.json_path.empty() && options.json_path != "-") check_output_path("--json", options.json_path);
  refuse_output_onto_input(options.json_path, options.files, options.settings.ds_config);
  const RunFiles run = read_run_files(options.files);
  const Settings settings = resolve_settings(options.settings, run);
  const Diagnosis diagnosis = diagnose(run, settings);
  std::ostream& out = options.json_path == "-" ? std::cerr : std::cout;
  std::ostringstream report;
  print_diagnosis(report, run, settings, diagnosis);
  out << printable_lines(report.str());
  if (options.json_path == "-") {
    std::cout << diagnosis_json(run, settings, diagnosis);
  } else if (!options.json_path.empty()) {
    write_output_file(options.json_path, diagnosis_json(run, settings, diagnosis));
  }
  return 0;
}

}  // namespace
}  // namespace seqpar::diagnose

int main(int argc, char** argv) {
  try {
    const int status = seqpar::diagnose::run(argc, argv);
    std::cout.flush();
    if (!std::cout) {
      std::cerr << "seqpar-diagnose: cannot write the report to standard output\n";
      return 1;
    }
    return status;
  } catch (const seqpar::InputError& error) {
    // One line, whatever a name in it holds; long enough for a few paths and names.
    std::cerr << "seqpar-diagnose: " << seqpar::abbreviated(error.what(), 2000) << '\n';
    return 2;
  } catch (const std::exception& error) {
    std::cerr << "seqpar-diagnose: " << seqpar::abbreviated(error.what(), 2000) << '\n';
    return 1;
  }
}
