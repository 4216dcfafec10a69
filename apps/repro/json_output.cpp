// --json FILE: the report's figures as JSON (schema: apps/repro/README.md).
//
// Written as a stream: each value goes to the file as soon as it is formatted, so a
// long run's per-step series is never held a second time as a document tree. Every
// step is one line, which keeps a 10,000-step file readable with grep and head.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <streambuf>
#include <vector>

#include "apps/repro/report.h"
#include "core/error.h"
#include "core/output_file.h"

namespace seqpar::repro {

namespace {

// A minimal streaming JSON writer: objects and arrays nest, commas and indentation
// follow from the nesting. A container opened `inline_` is written on one line.
class JsonWriter {
 public:
  explicit JsonWriter(std::ostream& out) : out_(out) {}

  JsonWriter& key(const char* name) {
    separate();
    string(name);
    out_ << ": ";
    after_key_ = true;
    return *this;
  }

  void begin_object(bool inline_ = false) { open('{', inline_); }
  void end_object() { close('}'); }
  void begin_array(bool inline_ = false) { open('[', inline_); }
  void end_array() { close(']'); }

  void value(const std::string& text) {
    separate();
    string(text.c_str());
  }
  void value(const char* text) { value(std::string(text)); }
  void value(int64_t number) {
    separate();
    out_ << number;
  }
  // JSON has no inf or NaN: they are written as null (the report says why a run
  // produced them). Numbers are written with the fewest digits that read back as the
  // same value: a float as a float (0.920605659, not 0.92060565948486328), a double
  // as a double (lr 0.0001, not 0.00010000000000000000479).
  void value(double number) { write_number(number, false); }
  void value(float number) { write_number(number, true); }

  void values(const std::vector<float>& numbers) {
    begin_array(true);
    for (float number : numbers) value(number);
    end_array();
  }

 private:
  struct Level {
    bool inline_, empty;
  };

  void write_number(double number, bool is_float) {
    separate();
    if (!std::isfinite(number)) {
      out_ << "null";
      return;
    }
    char text[32];
    for (int digits = 1; digits <= 17; ++digits) {
      std::snprintf(text, sizeof text, "%.*g", digits, number);
      const bool same = is_float ? std::strtof(text, nullptr) == static_cast<float>(number)
                                 : std::strtod(text, nullptr) == number;
      if (same) break;
    }
    out_ << text;
  }

  void open(char bracket, bool inline_) {
    separate();
    out_ << bracket;
    levels_.push_back({inline_ || (!levels_.empty() && levels_.back().inline_), true});
  }
  void close(char bracket) {
    const Level level = levels_.back();
    levels_.pop_back();
    if (!level.inline_ && !level.empty) newline();
    out_ << bracket;
    if (levels_.empty()) out_ << '\n';
  }
  // Before a key or a value: the comma and line break that separate it from the last.
  void separate() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (levels_.empty()) return;
    Level& level = levels_.back();
    if (!level.empty) out_ << (level.inline_ ? ", " : ",");
    if (!level.inline_) newline();
    level.empty = false;
  }
  void newline() {
    out_ << '\n';
    for (size_t i = 0; i < levels_.size(); ++i) out_ << "  ";
  }
  void string(const char* text) {
    out_ << '"';
    for (const char* c = text; *c; ++c) {
      const auto byte = static_cast<unsigned char>(*c);
      if (byte == '"' || byte == '\\') {
        out_ << '\\' << *c;
      } else if (byte == '\n') {
        out_ << "\\n";
      } else if (byte < 0x20) {
        char escaped[8];
        std::snprintf(escaped, sizeof escaped, "\\u%04x", byte);
        out_ << escaped;
      } else {
        out_ << *c;
      }
    }
    out_ << '"';
  }

  std::ostream& out_;
  std::vector<Level> levels_;
  bool after_key_ = false;
};

// An ostream's buffer that hands its bytes to an OutputFile 64 KB at a time.
class OutputFileBuffer : public std::streambuf {
 public:
  explicit OutputFileBuffer(OutputFile& file) : file_(file), bytes_(kBytes) {
    setp(bytes_.data(), bytes_.data() + bytes_.size());
  }

 protected:
  int_type overflow(int_type c) override {
    drain();
    if (!traits_type::eq_int_type(c, traits_type::eof())) {
      *pptr() = traits_type::to_char_type(c);
      pbump(1);
    }
    return traits_type::not_eof(c);
  }
  int sync() override {
    drain();
    return 0;
  }

 private:
  static constexpr size_t kBytes = 64 * 1024;
  void drain() {
    file_.write(pbase(), static_cast<size_t>(pptr() - pbase()));  // throws on failure
    setp(bytes_.data(), bytes_.data() + bytes_.size());
  }
  OutputFile& file_;
  std::vector<char> bytes_;
};

void write_step(JsonWriter& json, const StepFigures& s, size_t step) {
  const LrHistogram& h = s.histogram;
  json.begin_object(true);
  json.key("step").value(int64_t(step + 1));
  json.key("max_cross_rank_difference").value(s.max_cross_rank_difference);
  json.key("differing_parameters").value(s.differing_parameters);
  json.key("parameters").value(s.parameter_count);
  json.key("difference_in_lr_units").begin_object();
  json.key("identical").value(h.identical);
  json.key("below_half").value(h.below_half);
  json.key("about_one").value(h.about_one);
  json.key("about_two").value(h.about_two);
  json.key("beyond").value(h.beyond);
  json.end_object();
  json.key("max_difference_from_reference").value(s.max_difference_from_reference);
  json.key("max_ulps_from_reference").value(s.max_ulps_from_reference);
  json.key("parameters_beyond_rounding").value(s.parameters_beyond_rounding);
  json.key("parameters_unlike_reference").value(s.parameters_unlike_reference);
  json.key("gradients_unlike_reference").value(s.gradients_unlike_reference);
  json.key("gradient_relative_error").value(s.gradient_relative_error);
  json.key("loss_per_rank").values(s.losses);
  json.key("local_gradient_norm_per_rank").values(s.local_norms);
  json.key("used_gradient_norm_per_rank").values(s.used_norms);
  json.key("reference_loss").value(s.reference_loss);
  json.key("reference_gradient_norm").value(s.reference_norm);
  json.end_object();
}

void write_policy(JsonWriter& json, const PolicyFigures& figures) {
  json.begin_object();
  json.key("name").value(figures.policy->name);
  json.key("verdict").value(verdict_name(figures.verdict));
  if (!figures.skipped.empty()) {
    json.key("skipped").value(figures.skipped);
    json.end_object();
    return;
  }
  const SignAgreement& signs = figures.first_step_signs;
  json.key("verdict_text").value(figures.verdict_text);
  json.key("gradient_scale").value(figures.gradient_scale);
  json.key("seconds_per_step").value(figures.seconds_per_step);
  json.key("analysis_seconds_per_step").value(figures.analysis_seconds_per_step);
  json.key("broken_condition").value(figures.broken_condition);
  json.key("first_broken_step").value(figures.first_broken_step);
  json.key("first_step_signs").begin_object(true);
  json.key("opposite").value(signs.opposite);
  json.key("opposite_two_lr").value(signs.opposite_two_lr);
  json.key("same").value(signs.same);
  json.key("same_identical").value(signs.same_identical);
  json.end_object();
  json.key("steps").begin_array();
  for (size_t step = 0; step < figures.steps.size(); ++step) {
    write_step(json, figures.steps[step], step);
  }
  json.end_array();
  json.end_object();
}

void write_results(std::ostream& out, const RunResults& results) {
  const ReproConfig& c = results.config;
  JsonWriter json(out);
  json.begin_object();
  json.key("schema").value("seqpar-repro/3");
  json.key("world_size").value(c.world_size());
  json.key("sequence_parallel_size").value(c.sequence_parallel_size);
  json.key("data_parallel_size").value(c.data_parallel_size);
  json.key("rows").value(c.rows);
  json.key("steps").value(c.steps);
  json.key("lr").value(c.adamw.lr());
  json.key("placement").value(results.placement);
  json.key("initial_parameter_fingerprints").begin_array(true);
  for (const auto& parameters : results.initial_parameters) {
    char text[17];
    std::snprintf(text, sizeof text, "%016llx", (unsigned long long)fingerprint(parameters));
    json.value(text);
  }
  json.end_array();
  json.key("reference").begin_object();
  json.key("losses").values(results.reference.losses);
  json.key("gradient_norms").values(results.reference.norms);
  json.key("seconds_per_step").value(results.reference.seconds / double(c.steps));
  json.end_object();
  json.key("policies").begin_array();
  for (const PolicyRun& run : results.policies) write_policy(json, run.figures);
  json.end_array();
  json.end_object();
}

}  // namespace

void write_json(const std::string& path, const RunResults& results) {
  if (path == "-") {  // stdout, by the usual convention
    write_results(std::cout, results);
    std::cout << std::flush;
    return;
  }
  // Formatted straight into the output file (through a small buffer): the JSON text is
  // never held whole either.
  OutputFile file(path);
  OutputFileBuffer buffer(file);
  std::ostream out(&buffer);
  out.exceptions(std::ios::badbit);  // the file's error (a full disk, ...) reaches the caller
  write_results(out, results);
  out.flush();
  file.commit();
}

}  // namespace seqpar::repro
