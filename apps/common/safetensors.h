// Writes tensors in the safetensors format (https://huggingface.co/docs/safetensors),
// readable by PyTorch's and NumPy's safetensors loaders:
//
//   8 bytes   little-endian u64 N, the header's length
//   N bytes   JSON: {"__metadata__": {...}, "name": {"dtype": "F32", "shape": [...],
//             "data_offsets": [begin, end]}, ...}, padded with spaces to 8 bytes
//   the data  each tensor's float32 values, row-major, little-endian, back to back
//
// The file appears atomically (apps/common/output_file.h): it is written under a unique
// temporary name in the same folder, fsynced and renamed into place, so a reader never
// sees half a file, and a failed write leaves nothing behind. With read_back the file
// is read again and compared with what was written before it is put in place.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "apps/common/output_file.h"
#include "core/tensor.h"

namespace seqpar {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {},
                      bool read_back = false);

// The same into an OutputFile made by the caller (a dump's file in its staging
// directory); `shown_path` names it in errors. Commits the file.
void save_safetensors(OutputFile& file, const std::string& shown_path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata, bool read_back);

}  // namespace seqpar
