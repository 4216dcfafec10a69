// seqpar-diagnose's reading of what users have: rank numbers in names and folders,
// escaping of what it did not write, the DeepSpeed config's few keys with DeepSpeed's
// defaults, and lookups by name in time linear in the tensor count (10^5 tensors,
// bounded by the name comparisons made, not by a clock).
#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <unistd.h>

#include "apps/diagnose/diagnosis.h"
#include "apps/common/text.h"
#include "apps/diagnose/settings.h"
#include "core/error.h"

using namespace seqpar;
using namespace seqpar::diagnose;

TEST_CASE("diagnose: the rank a path names", "[diagnose]") {
  CHECK(rank_in_path("model_rank3.safetensors") == 3);
  CHECK(rank_in_path("model_rank0_step100.safetensors") == 0);
  CHECK(rank_in_path("out/rank2/model.safetensors") == 2);
  CHECK(rank_in_path("run7/rank_12/model_step5.safetensors") == 12);
  CHECK(rank_in_path("mp_rank_01_model_states.safetensors") == 1);
  CHECK(rank_in_path("RANK-4.safetensors") == 4);
  CHECK(rank_in_path("shard_5.safetensors") == 5);           // no "rank": the last number
  CHECK(rank_in_path("rank1/model_rank0.safetensors") == 0);  // the file's own name first
  CHECK(rank_in_path("model.safetensors") == -1);
  CHECK(rank_in_path("ranking/model.safetensors") == -1);
}

TEST_CASE("diagnose: a Hugging Face ds_config: read for its few keys, DeepSpeed's defaults", "[diagnose]") {
  const std::string hf = R"({"bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": 2e-5, "betas": [0.9, 0.95], "eps": "auto", "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto"}},
    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}},
    "gradient_clipping": "auto", "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto"})";
  const DeepSpeedSettings read = read_ds_config(hf, "hf.json");
  CHECK(read.settings.lr == 2e-5);
  CHECK(read.settings.beta2 == 0.95);
  CHECK(read.settings.weight_decay == 0.1);
  CHECK_FALSE(read.settings.eps);       // "auto": unknown
  CHECK_FALSE(read.settings.clipping);  // "auto": unknown
  CHECK(read.settings.sp == 0);         // from the flags or the files
  CHECK_FALSE(read.lr_is_auto);

  const DeepSpeedSettings plain = read_ds_config(R"({"optimizer": {"type": "Adam"}})", "plain.json");
  CHECK(plain.settings.lr == 1e-3);  // FusedAdam's defaults
  CHECK(plain.settings.beta1 == 0.9);
  CHECK(plain.settings.eps == 1e-8);
  CHECK(plain.settings.weight_decay == 0);
  CHECK(plain.settings.clipping == 0);  // DeepSpeed's gradient_clipping default: off
  CHECK(plain.settings.sp == 0);
  CHECK_THAT(plain.settings.sources[0], Catch::Contains("DeepSpeed's defaults"));

  const DeepSpeedSettings none = read_ds_config(R"({"train_batch_size": 8})", "none.json");
  CHECK_FALSE(none.settings.lr);  // the client's optimizer: unknown
  CHECK(read_ds_config(R"({"optimizer": {"params": {"lr": "auto"}}})", "a.json").lr_is_auto);
  CHECK_THROWS_AS(read_ds_config(R"({"gradient_cliping": 1.0})", "typo.json"), InputError);
  CHECK_THROWS_AS(read_ds_config(R"({"gradient_clipping": "one"})", "bad.json"), InputError);
  CHECK_THROWS_AS(read_ds_config(R"([1, 2])", "list.json"), InputError);
}

namespace {

// A safetensors file of `count` one-element float32 tensors named PREFIX0, PREFIX1, ...,
// written here byte by byte (seqpar's writer would need as many Tensors).
void write_many(const std::string& path, const std::string& prefix, int count, float value) {
  std::string header = "{", data;
  for (int i = 0; i < count; ++i) {
    header += (i ? "," : "") + std::string("\"") + prefix + std::to_string(i) + "\":{\"dtype\":\"F32\",\"shape\":[1]," +
              "\"data_offsets\":[" + std::to_string(4 * i) + "," + std::to_string(4 * i + 4) + "]}";
    data.append(reinterpret_cast<const char*>(&value), 4);
  }
  header += "}";
  header += std::string((8 - header.size() % 8) % 8, ' ');
  const uint64_t length = header.size();
  std::ofstream file(path, std::ios::binary);
  for (int byte = 0; byte < 8; ++byte) file.put(char((length >> (8 * byte)) & 0xff));
  file << header << data;
}

}  // namespace

TEST_CASE("diagnose: 100,000 tensors are looked up by hashing, not by scanning", "[diagnose]") {
  constexpr int kTensors = 100'000;
  char name[] = "/tmp/seqpar_diagnose_many.XXXXXX";
  REQUIRE(::mkdtemp(name) != nullptr);
  const std::string directory = name;
  FileLists lists;
  for (int rank = 0; rank < 2; ++rank) {
    lists.ranks.push_back(directory + "/model_rank" + std::to_string(rank) + ".safetensors");
    lists.grads.push_back(directory + "/grads_rank" + std::to_string(rank) + ".safetensors");
    write_many(lists.ranks.back(), "expert.", kTensors, 0.5f);
    write_many(lists.grads.back(), "expert.", kTensors, 0.25f);
  }
  lists.baseline.push_back(lists.ranks[0]);
  const int64_t before = name_comparisons();
  const RunFiles run = read_run_files(lists);
  Settings settings;
  settings.lr = 1e-4;
  settings.sp = 2;
  settings.dp = 1;
  const Diagnosis diagnosis = diagnose::diagnose(run, settings);
  const int64_t comparisons = name_comparisons() - before;
  CHECK(diagnosis.verdict == "IDENTICAL TO ONE-RANK TRAINING");
  CHECK(run.parameter_names.size() == size_t(kTensors));
  // A few dozen lookups per tensor, each a comparison or two; a scan per lookup would
  // make 10^10.
  INFO("name comparisons: " << comparisons);
  CHECK(comparisons < 100 * int64_t(kTensors));
  for (const auto& list : {lists.ranks, lists.grads}) {
    for (const std::string& path : list) std::remove(path.c_str());
  }
  ::rmdir(directory.c_str());
}
