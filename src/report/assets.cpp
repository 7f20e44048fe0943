// Embeds the report's JavaScript and CSS in the binary with the assembler's
// .incbin. CMakeLists.txt passes the files' paths and a hash of their bytes
// (so that a compiler cache never serves a stale object).
#include "assets.h"

#ifndef PATHKERNEL_PLOTLY_JS
#error "PATHKERNEL_PLOTLY_JS (the Plotly bundle's path) is set by CMakeLists.txt"
#endif
#ifndef PATHKERNEL_REPORT_ASSETS_HASH
#error "PATHKERNEL_REPORT_ASSETS_HASH is set by CMakeLists.txt"
#endif

#define PK_INCBIN(name, file)                                   \
  __asm__(".section .rodata\n"                                  \
          ".global pk_asset_" #name "_begin\n"                  \
          ".balign 16\n"                                        \
          "pk_asset_" #name "_begin:\n"                         \
          ".incbin \"" file "\"\n"                              \
          ".global pk_asset_" #name "_end\n"                    \
          "pk_asset_" #name "_end:\n"                           \
          ".byte 0\n"                                           \
          ".previous\n");                                       \
  extern "C" const char pk_asset_##name##_begin[];              \
  extern "C" const char pk_asset_##name##_end[];

PK_INCBIN(plotly, PATHKERNEL_PLOTLY_JS)
PK_INCBIN(page_js, PATHKERNEL_SOURCE_DIR "/src/report/page.js")
PK_INCBIN(page_css, PATHKERNEL_SOURCE_DIR "/src/report/page.css")

namespace pathkernel::report_assets {

namespace {
[[maybe_unused]] constexpr const char* kHash = PATHKERNEL_REPORT_ASSETS_HASH;
std::string_view view(const char* b, const char* e) { return {b, static_cast<size_t>(e - b)}; }
}  // namespace

std::string_view plotly_js() { return view(pk_asset_plotly_begin, pk_asset_plotly_end); }
std::string_view page_js() { return view(pk_asset_page_js_begin, pk_asset_page_js_end); }
std::string_view plotly_version() { return PATHKERNEL_PLOTLY_VERSION; }
std::string_view page_css() { return view(pk_asset_page_css_begin, pk_asset_page_css_end); }

}  // namespace pathkernel::report_assets
