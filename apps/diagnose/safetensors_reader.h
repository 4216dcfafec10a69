// Reads the safetensors files a user saved (safetensors.torch.save_file, or the few
// lines of Python in the README that write the same format): an 8-byte little-endian
// header length, a JSON header naming each tensor's dtype, shape and byte range, then
// the data. apps/common/safetensors.h writes the format; this is its reader, for the
// diagnosis only.
//
// Float32 is read as it is; float16 and bfloat16 are widened to float32, which holds
// every one of their values exactly, so bitwise comparisons keep their meaning. Float64
// is rounded to the nearest float32: differences below float32's resolution vanish, so
// a run with F64 tensors is judged at float32's (settings.cpp says so in the report).
// Any other dtype (integers, ...) is refused by name.
//
// Everything wrong with a file is a seqpar::InputError of one line naming the file and
// what is wrong: missing, not a regular file, a torch.save file (with the line that
// saves it as safetensors), shorter than its header says, a header larger than
// kMaxHeaderBytes or not JSON, a name given twice, a tensor whose bytes lie outside the
// data or do not match its shape, data bytes that no tensor covers. As the safetensors
// library does, the tensors' bytes must tile the data exactly.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace seqpar::diagnose {

// The format's own limit (the safetensors library refuses larger headers): a header
// holds names and shapes, never data.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct StoredTensor {
  std::string name;
  std::string dtype;  // as stored: "F32", "F16", "BF16" or "F64"
  std::vector<int64_t> shape;
  std::vector<float> values;  // row-major
};

struct StoredFile {
  std::string path;
  std::vector<StoredTensor> tensors;  // in the order of their data in the file
  std::vector<std::string> skipped;   // the names `skip` chose, not decoded
  std::map<std::string, std::string> metadata;
};

// `skip`: names whose tensors are left out undecoded (their dtype is not checked, their
// bytes still must lie in the data).
StoredFile read_safetensors(const std::string& path, bool (*skip)(const std::string& name) = nullptr);

// The same from the file's bytes, already read (`path` only names the file in the
// errors): what read_safetensors does once it has checked that the path is a regular
// file and read it. Every input ends in a StoredFile or an InputError.
StoredFile parse_safetensors(const std::string& bytes, const std::string& path,
                             bool (*skip)(const std::string& name) = nullptr);

// Exact widenings of the two 16-bit formats.
float float_from_half(uint16_t bits);
float float_from_bfloat16(uint16_t bits);

// "[3, 640]"
std::string shape_text(const std::vector<int64_t>& shape);

}  // namespace seqpar::diagnose
