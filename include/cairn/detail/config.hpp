// cairn/detail/config.hpp: how cairn's non-template functions are compiled.
//
// Header-only (the default): every header brings the bodies of its functions (its `-inl.hpp`),
// declared `inline`, and nothing is linked. Separate compilation (`CAIRN_SEPARATE_COMPILATION`,
// set by linking the CMake target `cairn::compiled`): headers declare those functions only, and
// their bodies are compiled once, into the library that `cairn/compiled.hpp` builds, so a file
// that includes cairn parses declarations and compiles only its own templates.
#pragma once

#ifdef CAIRN_SEPARATE_COMPILATION
/// 1 when every header brings its function bodies (the default), 0 with separate compilation.
#  define CAIRN_HEADER_ONLY 0
/// `inline` when header-only; nothing with separate compilation (one definition, in the library).
#  define CAIRN_INLINE
#else
#  define CAIRN_HEADER_ONLY 1
#  define CAIRN_INLINE inline
#endif
