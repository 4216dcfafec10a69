// Moved to tests/cuda_test_util.h; this forwards for the tests still in tests/cuda/.
#pragma once

#include "tests/cuda_test_util.h"
