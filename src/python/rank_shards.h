// A rank's shards as a trainer hands them from Python (src/python): torch
// tensors or buffers, on the CPU or one GPU, checked against the layout;
// and a rank's digest parts as hex.
#ifndef DCR_PYTHON_RANK_SHARDS_H_
#define DCR_PYTHON_RANK_SHARDS_H_

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dcr/digest.h"
#include "dcr/layout.h"
#include "dcr/shard_diff.h"
#include "python/module_common.h"

namespace dcr::python {

// A rank's shards as handed from Python: their bytes in host memory, or
// spans of one GPU's memory (torch CUDA tensors).
struct Placed {
  ShardBytes shards;
  int device = -1;          // CUDA device index; -1: host memory
  std::vector<Bytes> held;  // keeps host buffers alive
  // Views (detach) that hold the CUDA tensors' storage while the GIL is
  // released (another thread may repoint a tensor); freed with the GIL.
  std::vector<py::object> tensors;
};

// "the CPU" for a negative device, else "cuda:N".
std::string Where(int device);

// A name -> tensor dict as rank `rank`'s shards (the others the layout
// does not give it are ignored). A torch tensor must have the layout's
// shape and dtype; sizes are checked for any buffer. CUDA tensors are
// taken as spans of their device's memory, all on one device and
// contiguous; torch's current stream there is synchronized first, so the
// optimizer step's kernels have finished. Called with the GIL held.
Placed ShardsOf(const Layout& layout, uint32_t rank, const py::dict& named);

// A digest part (a rank's share of a tensor digest) as the hex of a
// Digest128, and back (ValueError for bad hex).
std::string DigestPartHex(const LinearDigest& d);
LinearDigest DigestPartFromHex(const std::string& s);

}  // namespace dcr::python

#endif  // DCR_PYTHON_RANK_SHARDS_H_
