#include "autograd/engine.h"

#include <deque>
#include <unordered_map>
#include <unordered_set>

#include "autograd/node.h"
#include "core/elementwise.h"
#include "core/error.h"
#include "core/nvtx.h"

namespace seqpar::autograd {

namespace {

thread_local bool grad_mode = true;

// For every Node reachable from the root: how many edges point at it. A Node may
// run only after that many gradients have reached it.
std::unordered_map<Node*, int> count_dependencies(Node* root) {
  std::unordered_map<Node*, int> dependencies;
  std::unordered_set<Node*> visited{root};
  std::vector<Node*> to_visit{root};
  while (!to_visit.empty()) {
    Node* node = to_visit.back();
    to_visit.pop_back();
    for (const Edge& edge : node->next_edges()) {
      if (!edge.valid()) continue;
      Node* next = edge.node.get();
      ++dependencies[next];
      if (visited.insert(next).second) to_visit.push_back(next);
    }
  }
  return dependencies;
}

// A gradient a Node returned for its input `index` must look like that input.
void check_gradient(const Node& node, size_t index, const Tensor& gradient) {
  const InputMetadata& expected = node.input_metadata()[index];
  SEQPAR_CHECK(gradient.defined(), "backward of ", node.name(), ": gradient for input ", index,
               " is undefined, but that input requires grad");
  SEQPAR_CHECK(gradient.shape() == expected.shape, "backward of ", node.name(),
               ": gradient for input ", index, " has shape ", gradient.shape(),
               " but the input has shape ", expected.shape);
  SEQPAR_CHECK(gradient.device() == expected.device, "backward of ", node.name(),
               ": gradient for input ", index, " is on ", gradient.device(),
               " but the input is on ", expected.device);
}

}  // namespace

bool grad_mode_enabled() { return grad_mode; }

NoGradGuard::NoGradGuard() : previous_(grad_mode) { grad_mode = false; }
NoGradGuard::~NoGradGuard() { grad_mode = previous_; }

// Nodes wait in `pending` until their last gradient arrives, then move to the ready
// queue. Gradients for one Node are summed in arrival order, which the graph fixes,
// so the sums are the same on every run. The graph is kept after the pass (as
// PyTorch's retain_graph=True): a second backward through it accumulates again.
void run_backward(const Variable& root, const Tensor& seed_gradient) {
  SEQPAR_CHECK(root.defined() && seed_gradient.defined(), "backward: undefined root or gradient");
  SEQPAR_CHECK(seed_gradient.shape() == root.shape(), "backward: gradient of shape ",
               seed_gradient.shape(), " for an output of shape ", root.shape());
  SEQPAR_CHECK(seed_gradient.device() == root.device(), "backward: gradient on ",
               seed_gradient.device(), " for an output on ", root.device());
  const Edge root_edge = root.gradient_edge();
  SEQPAR_CHECK(root_edge.valid(), "backward: the output does not require grad (no input of the "
               "ops that made it requires grad, or it was made under NoGradGuard)");

  SEQPAR_NVTX_RANGE("backward");
  NoGradGuard no_grad;  // backward formulas must not record graphs of their own
  std::unordered_map<Node*, int> dependencies = count_dependencies(root_edge.node.get());
  std::unordered_map<Node*, Tensor> pending;
  std::deque<std::pair<std::shared_ptr<Node>, Tensor>> ready;
  ready.emplace_back(root_edge.node, seed_gradient);

  while (!ready.empty()) {
    auto [node, grad_output] = std::move(ready.front());
    ready.pop_front();
    const std::vector<Tensor> grad_inputs = node->apply(grad_output);
    const std::vector<Edge>& edges = node->next_edges();
    SEQPAR_CHECK(grad_inputs.size() == edges.size(), "backward of ", node->name(), ": returned ",
                 grad_inputs.size(), " gradients for ", edges.size(), " inputs");
    for (size_t i = 0; i < edges.size(); ++i) {
      if (!edges[i].valid()) continue;
      check_gradient(*node, i, grad_inputs[i]);
      Node* next = edges[i].node.get();
      Tensor& sum = pending[next];
      sum = sum.defined() ? seqpar::add(sum, grad_inputs[i]) : grad_inputs[i];
      if (--dependencies[next] == 0) {
        ready.emplace_back(edges[i].node, std::move(sum));
        pending.erase(next);
      }
    }
  }
}

}  // namespace seqpar::autograd
