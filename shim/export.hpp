#pragma once
// Symbols the application sees. Everything else in libstreamcoll is hidden.
#define SC_EXPORT extern "C" __attribute__((visibility("default")))
