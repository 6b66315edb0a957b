// The FP8 functions of the `dcr` Python module: quantize_fp8 and
// fp8_e4m3_table (docs/PYTHON.md).
#ifndef DCR_PYTHON_FP8_FUNCTIONS_H_
#define DCR_PYTHON_FP8_FUNCTIONS_H_

#include <pybind11/pybind11.h>

namespace dcr::python {

void AddFp8Functions(pybind11::module_& m);

}  // namespace dcr::python

#endif  // DCR_PYTHON_FP8_FUNCTIONS_H_
