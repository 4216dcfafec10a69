#include "apps/common/json_limits.h"

#include <nlohmann/json.hpp>

#include <unordered_set>
#include <vector>

#include "core/error.h"

namespace seqpar {

namespace {

using nlohmann::json;

class LimitsCheck : public nlohmann::json_sax<json> {
 public:
  LimitsCheck(const std::string& what, size_t max_values) : what_(what), max_values_(max_values) {}
  JsonScan scan;

  bool start_object(std::size_t) override {
    open();
    keys_.emplace_back();
    return true;
  }
  bool end_object() override {
    keys_.pop_back();
    return --depth_, true;
  }
  bool start_array(std::size_t) override { return open(), true; }
  bool end_array() override { return --depth_, true; }
  bool key(string_t& name) override {
    if (!keys_.back().insert(name).second && scan.duplicate_key.empty()) scan.duplicate_key = name;
    return true;
  }
  bool null() override { return count(); }
  bool boolean(bool) override { return count(); }
  bool number_integer(number_integer_t) override { return count(); }
  bool number_unsigned(number_unsigned_t) override { return count(); }
  bool number_float(number_float_t, const string_t&) override { return count(); }
  bool string(string_t&) override { return count(); }
  bool binary(binary_t&) override { return count(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    scan.well_formed = false;
    return false;
  }

 private:
  void open() {
    SEQPAR_INPUT_CHECK(depth_ < kMaxJsonDepth, what_, ": nested deeper than the limit of ", kMaxJsonDepth,
                       " levels");
    ++depth_;
    count();
  }
  bool count() {
    SEQPAR_INPUT_CHECK(++values_ <= max_values_, what_, ": more than the limit of ", max_values_, " values");
    return true;
  }

  const std::string& what_;
  const size_t max_values_;
  int depth_ = 0;
  size_t values_ = 0;
  std::vector<std::unordered_set<std::string>> keys_;  // of each open object
};

}  // namespace

JsonScan scan_json(const std::string& text, const std::string& what, size_t max_values) {
  LimitsCheck check(what, max_values);
  json::sax_parse(text, &check);
  return check.scan;
}

}  // namespace seqpar
