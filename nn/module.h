// Module: a named tree of parameters, as torch.nn.Module. Parameters are leaf
// Variables that require grad; submodules contribute theirs with dotted names
// ("linear.weight").
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "autograd/variable.h"

namespace seqpar::nn {

class Module {
 public:
  virtual ~Module() = default;

  // In registration order, submodules' parameters after the module's own.
  std::vector<std::pair<std::string, autograd::Variable>> named_parameters() const;
  std::vector<autograd::Variable> parameters() const;
  void zero_grad() const;

 protected:
  autograd::Variable register_parameter(const std::string& name, Tensor value);
  void register_module(const std::string& name, std::shared_ptr<Module> module);

 private:
  std::vector<std::pair<std::string, autograd::Variable>> parameters_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

}  // namespace seqpar::nn
