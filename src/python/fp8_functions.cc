// The FP8 functions of the `dcr` Python module (docs/PYTHON.md, "FP8").
#include "python/fp8_functions.h"

#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "dcr/dtype.h"
#include "dcr/fp8.h"
#include "python/module_common.h"

namespace dcr::python {

void AddFp8Functions(py::module_& m) {
  using namespace pybind11::literals;
  m.def(
      "quantize_fp8",
      [](const py::handle& src, const std::string& dtype, uint64_t rows,
         uint64_t cols, uint32_t block_rows, uint32_t block_cols,
         float min_amax) {
        Bytes b = BytesOf(src, false, "src");
        Fp8Tensor t;
        t.dtype = Take(ParseDType(dtype));
        t.rows = rows;
        t.cols = cols;
        t.block_rows = block_rows;
        t.block_cols = block_cols;
        t.min_amax = min_amax;
        Check(CheckFp8Tensor(t));
        std::string q(t.elements(), '\0');
        std::string scales(t.blocks() * sizeof(float), '\0');
        Check(QuantizeFp8(
            t, b.span(),
            std::span(reinterpret_cast<uint8_t*>(q.data()), q.size()),
            std::span(reinterpret_cast<float*>(scales.data()), t.blocks())));
        return py::make_tuple(py::bytes(q), py::bytes(scales));
      },
      "src"_a, "dtype"_a, "rows"_a, "cols"_a, "block_rows"_a = 128,
      "block_cols"_a = 128, "min_amax"_a = kFp8DefaultMinAmax,
      "the FP8 E4M3 quantizer a receiver layout declares (docs/PLACEMENT.md "
      "§FP8 serving) on a [rows, cols] tensor of BF16, F16 or F32 bits: "
      "(codes, scale_inv) as bytes, codes row-major, scale_inv F32 "
      "[blocks down, blocks across]; block_rows = block_cols = 0 for one "
      "scale");

  m.def(
      "fp8_e4m3_table",
      []() {
        const float* t = Fp8E4M3Table();
        return std::vector<float>(t, t + 256);
      },
      "the value of every E4M3 code (NaN for 0x7F and 0xFF)");
}

}  // namespace dcr::python
