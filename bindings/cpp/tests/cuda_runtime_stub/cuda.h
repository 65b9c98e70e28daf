// Compile-only stand-in (see cuda_runtime_api.h): nothing of the driver API is needed.
#pragma once
