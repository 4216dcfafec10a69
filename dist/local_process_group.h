// LocalProcessGroup: N ranks as threads of one process, the way PyTorch's tests use
// a threaded process group. It lets CI and a one-GPU machine run any world size.
//
//   dist::run_local_world(4, [](std::shared_ptr<dist::ProcessGroup> world) {
//     Tensor gradient = ...;            // this rank's part
//     world->all_reduce(gradient);      // every rank now holds the same sum
//   });
//
// Tensors live on the CPU, or all ranks' tensors on one GPU. A collective waits for
// every rank, then one thread (the last to arrive) computes the result: sums as
// integer additions of the ranks' exact digits (so the same bits as any other group;
// the words NCCL would carry, in the same two collectives: dist/packed_digits.h), max
// in rank order. Every rank receives the same bits. On a GPU that computation is a
// sequence of kernels on the device's single stream (shared by all host threads,
// core/cuda_runtime.h): each rank's earlier kernels were enqueued before it arrived,
// the reduction is enqueued before anyone leaves, and each rank's copy of the result is
// enqueued after that, so stream order alone keeps the data consistent. The one host
// round trip is an exact sum's agreed hulls, which size its second collective.
//
// Failure: a rank thread that throws makes every rank waiting in, or later calling,
// a collective of any group of the world fail with "<op> on group <name>: rank R
// failed: <its message>". A collective some member never reaches fails after the
// timeout, naming the missing ranks. run_local_world then rethrows the first failure.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dist/process_group.h"

namespace seqpar::dist {

namespace detail {
class Rendezvous;
}

struct LocalOptions {
  // How long a collective waits for the last member before it fails.
  std::chrono::milliseconds timeout{60000};
};

using RankBody = std::function<void(std::shared_ptr<ProcessGroup> world)>;

// Runs `body` on world_size threads, one per rank, each with its world group, and
// joins them. Throws seqpar::Error "rank R failed: <message>" for the first rank
// that failed (a rank's own exception, or the collective error that stopped it).
void run_local_world(int world_size, const RankBody& body, LocalOptions options = {});

class LocalProcessGroup final : public ProcessGroup {
 public:
  LocalProcessGroup(std::shared_ptr<detail::Rendezvous> rendezvous, int rank);

  int rank() const override { return rank_; }
  int size() const override;
  const std::vector<int>& global_ranks() const override;
  std::string name() const override;

  void all_reduce(Tensor& tensor, ReduceOp op = ReduceOp::Sum) override;

  void all_gather(Tensor& output, const Tensor& input) override;
  void all_to_all(Tensor& output, const Tensor& input) override;
  // The last rank to arrive checks that the pairs match and the shapes agree.
  void send_recv(Tensor& output, const Tensor& input, int send_to, int receive_from) override;
  void broadcast(Tensor& tensor, int root = 0) override;
  void barrier() override;
  std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks,
                                          const std::string& name) override;
  // All the groups in one collective.
  std::shared_ptr<ProcessGroup> split(const std::vector<std::vector<int>>& groups,
                                      const std::vector<std::string>& names) override;

 protected:
  void all_reduce_words(int64_t* words, int64_t count, WordOp op, const DigitsCall& call) override;

 private:
  std::shared_ptr<detail::Rendezvous> rendezvous_;
  int rank_;
};

}  // namespace seqpar::dist
