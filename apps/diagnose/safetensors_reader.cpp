#include "apps/diagnose/safetensors_reader.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "apps/common/json_limits.h"
#include "apps/common/text.h"
#include "core/error.h"

namespace seqpar::diagnose {

namespace {

using nlohmann::json;

static_assert(sizeof(float) == 4, "float32 values are read as 4-byte floats");

uint64_t little_endian_u64(const unsigned char* bytes) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | bytes[i];
  return value;
}

int dtype_bytes(const std::string& path, const std::string& name, const std::string& dtype) {
  if (dtype == "F64") return 8;
  if (dtype == "F32") return 4;
  if (dtype == "F16" || dtype == "BF16") return 2;
  SEQPAR_INPUT_FAIL(path, ": tensor '", abbreviated(name), "' is ", abbreviated(dtype),
                    "; seqpar-diagnose reads F32, F16, BF16 and F64 (convert it to float32 before saving)");
}

// The file's bytes, after checking that it is a regular file (a FIFO or device would
// block or never end).
std::string whole_file(const std::string& path) {
  struct stat status {};
  SEQPAR_INPUT_CHECK(::stat(path.c_str(), &status) == 0, path, ": cannot read: ", std::strerror(errno));
  SEQPAR_INPUT_CHECK(S_ISREG(status.st_mode), path, ": not a regular file");
  std::ifstream file(path, std::ios::binary);
  SEQPAR_INPUT_CHECK(file.is_open(), path, ": cannot open: ", std::strerror(errno));
  std::string bytes(static_cast<size_t>(status.st_size), '\0');
  file.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  SEQPAR_INPUT_CHECK(file.gcount() == static_cast<std::streamsize>(bytes.size()), path,
                     ": read ", file.gcount(), " of its ", bytes.size(), " bytes");
  return bytes;
}

// A torch.save file is a zip archive ("PK\3\4"), or before PyTorch 1.6 a pickle
// (protocol 2 to 5: 0x80 0x02..0x05). A safetensors header of 640, 896, 1152 or 1408
// bytes starts with the same two bytes, but its JSON follows at byte 8.
void refuse_torch_save(const std::string& path, const std::string& bytes) {
  const bool zip = bytes.compare(0, 4, "PK\x03\x04") == 0;
  const bool pickle = bytes.size() >= 2 && bytes[0] == '\x80' && bytes[1] >= 2 && bytes[1] <= 5 &&
                      !(bytes.size() > 8 && bytes[8] == '{');
  SEQPAR_INPUT_CHECK(!zip && !pickle, path, ": a torch.save file (", zip ? "a zip archive" : "a pickle",
                     "), not safetensors; save it as safetensors with: python3 -c \"import torch; "
                     "from safetensors.torch import save_file; save_file({k: v.float().contiguous() "
                     "for k, v in torch.load('", path, "').items()}, '", path, ".safetensors')\"");
}

// The header as JSON: within the limits of apps/common/json_limits.h, and no name given
// twice, which the tree would keep the last of and the safetensors library refuses.
json parse_header(const std::string& path, const std::string& text) {
  const JsonScan scan = scan_json(text, path + ": the header");
  SEQPAR_INPUT_CHECK(scan.duplicate_key.empty(), path, ": the header names '", abbreviated(scan.duplicate_key),
                     "' twice (the safetensors library refuses such a file)");
  json header;
  try {
    header = json::parse(text);
  } catch (const json::exception& error) {
    SEQPAR_INPUT_FAIL(path, ": the header is not JSON (", error.what(), ")");
  }
  SEQPAR_INPUT_CHECK(header.is_object(), path, ": the header is not a JSON object");
  return header;
}

std::vector<int64_t> shape_of(const std::string& path, const std::string& name, const json& entry) {
  const json& shape = entry.at("shape");
  SEQPAR_INPUT_CHECK(shape.is_array(), path, ": tensor '", name, "': shape is not a list");
  std::vector<int64_t> dims;
  for (const json& dim : shape) {
    SEQPAR_INPUT_CHECK(dim.is_number_unsigned() && dim.get<uint64_t>() < (uint64_t{1} << 48), path,
                       ": tensor '", name, "': shape ", shape.dump(), " is not a list of sizes");
    dims.push_back(dim.get<int64_t>());
  }
  return dims;
}

// Decodes one header entry and its bytes of `data`.
// `decode`: false for a skipped tensor, whose dtype is not checked.
StoredTensor read_tensor(const std::string& path, const std::string& full_name, const json& entry,
                         const std::string& data, std::pair<uint64_t, uint64_t>& range, bool decode) {
  const std::string name = abbreviated(full_name);  // for the errors
  SEQPAR_INPUT_CHECK(entry.is_object() && entry.contains("dtype") && entry.contains("shape") &&
                         entry.contains("data_offsets") && entry.at("dtype").is_string(),
                     path, ": tensor '", name, "' lacks dtype, shape or data_offsets");
  StoredTensor tensor{full_name, entry.at("dtype").get<std::string>(), shape_of(path, name, entry), {}};
  const int bytes = decode ? dtype_bytes(path, name, tensor.dtype) : 0;
  const json& offsets = entry.at("data_offsets");
  SEQPAR_INPUT_CHECK(offsets.is_array() && offsets.size() == 2 && offsets[0].is_number_unsigned() &&
                         offsets[1].is_number_unsigned(),
                     path, ": tensor '", name, "': data_offsets is not [begin, end]");
  range = {offsets[0].get<uint64_t>(), offsets[1].get<uint64_t>()};
  uint64_t count = 1;
  for (int64_t dim : tensor.shape) {
    SEQPAR_INPUT_CHECK(dim == 0 || count <= (uint64_t{1} << 48) / uint64_t(dim), path, ": tensor '",
                       name, "': shape ", shape_text(tensor.shape), " is too large");
    count *= uint64_t(dim);
  }
  SEQPAR_INPUT_CHECK(range.first <= range.second && (!decode || range.second - range.first == count * bytes), path,
                     ": tensor '", name, "': data_offsets [", range.first, ", ", range.second,
                     "] do not hold shape ", shape_text(tensor.shape), " of ", abbreviated(tensor.dtype));
  SEQPAR_INPUT_CHECK(range.second <= data.size(), path, ": truncated: tensor '", name,
                     "' ends at byte ", range.second, " of the data, but the file holds ",
                     data.size(), " bytes of data");
  if (!decode) return tensor;
  tensor.values.resize(count);
  const char* source = data.data() + range.first;
  for (uint64_t i = 0; i < count; ++i) {
    if (bytes == 8) {
      // Rounded to the nearest float32: the values are held as float32 (the diagnosis
      // then judges the run at float32's resolution, settings.cpp says so).
      double value = 0;
      std::memcpy(&value, source + 8 * i, 8);
      tensor.values[i] = float(value);
    } else if (bytes == 4) {
      std::memcpy(&tensor.values[i], source + 4 * i, 4);
    } else {
      uint16_t half = 0;
      std::memcpy(&half, source + 2 * i, 2);
      tensor.values[i] = tensor.dtype == "F16" ? float_from_half(half) : float_from_bfloat16(half);
    }
  }
  return tensor;
}

}  // namespace

std::string shape_text(const std::vector<int64_t>& shape) { return detail::concat(shape); }

float float_from_half(uint16_t bits) {
  const uint32_t sign = uint32_t(bits >> 15) << 31;
  const int exponent = (bits >> 10) & 0x1f;
  const uint32_t mantissa = bits & 0x3ff;
  float magnitude;
  if (exponent == 0x1f) {
    magnitude = mantissa ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -24);  // subnormal: m x 2^-24
  } else {
    magnitude = std::ldexp(static_cast<float>(mantissa | 0x400), exponent - 25);
  }
  uint32_t word = 0;
  std::memcpy(&word, &magnitude, 4);
  word |= sign;
  float value = 0;
  std::memcpy(&value, &word, 4);
  return value;
}

float float_from_bfloat16(uint16_t bits) {
  const uint32_t word = uint32_t(bits) << 16;
  float value = 0;
  std::memcpy(&value, &word, 4);
  return value;
}

namespace {

// The tensors' byte ranges, in order, must tile [0, data_bytes): no overlap, no gap, no
// bytes after the last (the safetensors library refuses the same files).
void check_tiling(const std::string& path, std::vector<std::pair<std::pair<uint64_t, uint64_t>, size_t>>& ranges,
                  const std::vector<StoredTensor>& tensors, uint64_t data_bytes) {
  std::sort(ranges.begin(), ranges.end());
  uint64_t covered = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const auto [begin, end] = ranges[i].first;
    SEQPAR_INPUT_CHECK(begin >= covered || i == 0, path, ": tensors '", abbreviated(tensors[ranges[i - 1].second].name),
                       "' and '", abbreviated(tensors[ranges[i].second].name), "' overlap in the data");
    SEQPAR_INPUT_CHECK(begin == covered, path, ": data bytes ", covered, " to ", begin,
                       " belong to no tensor (the safetensors library refuses such a file)");
    covered = end;
  }
  SEQPAR_INPUT_CHECK(covered == data_bytes, path, ": data bytes ", covered, " to ", data_bytes,
                     " after the last tensor belong to no tensor (the safetensors library refuses such a file)");
}

}  // namespace

StoredFile read_safetensors(const std::string& path, bool (*skip)(const std::string& name)) {
  return parse_safetensors(whole_file(path), path, skip);
}

StoredFile parse_safetensors(const std::string& bytes, const std::string& path,
                             bool (*skip)(const std::string& name)) {
  refuse_torch_save(path, bytes);
  SEQPAR_INPUT_CHECK(bytes.size() >= 8, path, ": truncated: ", bytes.size(),
                     " bytes, not even the 8-byte header length (is it a safetensors file?)");
  const uint64_t length = little_endian_u64(reinterpret_cast<const unsigned char*>(bytes.data()));
  SEQPAR_INPUT_CHECK(length <= kMaxHeaderBytes, path, ": the header claims ", length,
                     " bytes, above the format's limit of ", kMaxHeaderBytes,
                     " (a corrupt file, or not safetensors)");
  SEQPAR_INPUT_CHECK(8 + length <= bytes.size(), path, ": truncated: the header claims ", length,
                     " bytes, but the file holds ", bytes.size() - 8, " after the length");
  const json header = parse_header(path, bytes.substr(8, length));
  const std::string data = bytes.substr(8 + length);
  StoredFile file{path, {}, {}, {}};
  std::vector<StoredTensor> tensors;  // decoded and skipped, for the tiling check
  std::vector<std::pair<std::pair<uint64_t, uint64_t>, size_t>> ranges;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      SEQPAR_INPUT_CHECK(entry.is_object(), path, ": __metadata__ is not an object");
      for (const auto& [key, value] : entry.items()) {
        SEQPAR_INPUT_CHECK(value.is_string(), path, ": __metadata__ '", abbreviated(key), "' is not a string");
        file.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    std::pair<uint64_t, uint64_t> range;
    tensors.push_back(read_tensor(path, name, entry, data, range, !(skip && skip(name))));
    ranges.push_back({range, tensors.size() - 1});
  }
  check_tiling(path, ranges, tensors, data.size());
  for (const auto& range : ranges) {
    StoredTensor& tensor = tensors[range.second];
    if (skip && skip(tensor.name)) file.skipped.push_back(std::move(tensor.name));
    else file.tensors.push_back(std::move(tensor));
  }
  return file;
}

}  // namespace seqpar::diagnose
