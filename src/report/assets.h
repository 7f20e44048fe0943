// The files the report inlines, embedded in the binary at build time
// (assets.cpp): the plotting library and the page's own script and style.
// Internal to src/report.
#pragma once

#include <string_view>

namespace pathkernel::report_assets {

std::string_view plotly_js();  ///< the pinned Plotly bundle, minified
std::string_view page_js();    ///< src/report/page.js
std::string_view page_css();   ///< src/report/page.css
std::string_view plotly_version();  ///< e.g. "plotly.js-cartesian-dist-min 2.35.3"

}  // namespace pathkernel::report_assets
