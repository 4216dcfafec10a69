#include "nn/module.h"

#include "core/error.h"

namespace seqpar::nn {

namespace {

// A name is one path component: dots are how submodule names are joined.
void check_name(const char* what, const std::string& name) {
  SEQPAR_CHECK(!name.empty(), what, ": the name must not be empty");
  SEQPAR_CHECK(name.find('.') == std::string::npos, what, ": name '", name,
               "' must not contain '.' (dots join submodule names)");
}

template <typename Entries>
bool has_name(const Entries& entries, const std::string& name) {
  for (const auto& entry : entries) {
    if (entry.first == name) return true;
  }
  return false;
}

}  // namespace

autograd::Variable Module::register_parameter(const std::string& name, Tensor value) {
  check_name("register_parameter", name);
  SEQPAR_CHECK(!has_name(parameters_, name) && !has_name(children_, name),
               "register_parameter: '", name, "' is already registered");
  autograd::Variable parameter(std::move(value), /*requires_grad=*/true);
  parameters_.emplace_back(name, parameter);
  return parameter;
}

void Module::register_module(const std::string& name, std::shared_ptr<Module> module) {
  check_name("register_module", name);
  SEQPAR_CHECK(module != nullptr, "register_module: module '", name, "' is null");
  SEQPAR_CHECK(!has_name(parameters_, name) && !has_name(children_, name),
               "register_module: '", name, "' is already registered");
  children_.emplace_back(name, std::move(module));
}

std::vector<std::pair<std::string, autograd::Variable>> Module::named_parameters() const {
  std::vector<std::pair<std::string, autograd::Variable>> named = parameters_;
  for (const auto& [child_name, child] : children_) {
    for (auto& [name, parameter] : child->named_parameters()) {
      named.emplace_back(child_name + "." + name, parameter);
    }
  }
  return named;
}

std::vector<autograd::Variable> Module::parameters() const {
  std::vector<autograd::Variable> values;
  for (auto& entry : named_parameters()) values.push_back(entry.second);
  return values;
}

void Module::zero_grad() const {
  for (const autograd::Variable& parameter : parameters()) parameter.zero_grad();
}

}  // namespace seqpar::nn
