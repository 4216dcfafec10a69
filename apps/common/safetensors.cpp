#include "apps/common/safetensors.h"

#include <cstdint>
#include <cstdio>
#include <sstream>

#include "core/error.h"
#include "apps/common/output_file.h"

namespace seqpar {

static_assert(sizeof(float) == 4, "safetensors F32 needs 4-byte floats");

namespace {

std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
      out += escaped;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string header_json(const NamedTensors& tensors,
                        const std::map<std::string, std::string>& metadata) {
  std::ostringstream out;
  out << '{';
  if (!metadata.empty()) {
    out << "\"__metadata__\":{";
    bool first = true;
    for (const auto& [key, value] : metadata) {
      out << (first ? "" : ",") << json_string(key) << ':' << json_string(value);
      first = false;
    }
    out << "},";
  }
  uint64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& tensor = tensors[i].second;
    const uint64_t bytes = static_cast<uint64_t>(tensor.numel()) * sizeof(float);
    out << (i ? "," : "") << json_string(tensors[i].first) << ":{\"dtype\":\"F32\",\"shape\":[";
    for (int64_t d = 0; d < tensor.dim(); ++d) out << (d ? "," : "") << tensor.size(d);
    out << "],\"data_offsets\":[" << offset << ',' << offset + bytes << "]}";
    offset += bytes;
  }
  out << '}';
  std::string header = out.str();
  header.append((8 - header.size() % 8) % 8, ' ');  // keeps the data 8-byte aligned
  return header;
}

}  // namespace

void save_safetensors(OutputFile& file, const std::string& shown_path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata, bool read_back) {
  for (const auto& [name, tensor] : tensors) {
    SEQPAR_CHECK(tensor.defined(), "save_safetensors ", shown_path, ": tensor '", name,
                 "' is undefined");
    SEQPAR_CHECK(!name.empty() && name != "__metadata__", "save_safetensors ", shown_path,
                 ": invalid tensor name '", name, "'");
  }
  const std::string header = header_json(tensors, metadata);
  uint64_t length = header.size();
  unsigned char length_bytes[8];
  for (int i = 0; i < 8; ++i) length_bytes[i] = static_cast<unsigned char>(length >> (8 * i));
  file.write(length_bytes, 8);
  file.write(header);
  for (const auto& [name, tensor] : tensors) {
    const std::vector<float> values = tensor.to_vector();  // row-major host copy
    file.write(values.data(), values.size() * sizeof(float));
  }
  file.commit(read_back);
}

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata, bool read_back) {
  OutputFile file(path);
  save_safetensors(file, path, tensors, metadata, read_back);
}

}  // namespace seqpar
