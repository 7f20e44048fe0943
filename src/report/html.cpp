// The report as one self-contained HTML page: the style, the plotting
// library, the data and the page's script, all inline.
#include <stb_image_write.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <ctime>

#include "assets.h"
#include "pathkernel/error.h"
#include "pathkernel/files.h"
#include "pathkernel/report.h"
#include "pathkernel/version.h"

namespace pathkernel {

namespace {

void append(void* context, void* data, int size) {
  static_cast<std::string*>(context)->append(static_cast<const char*>(data), static_cast<size_t>(size));
}

std::string base64(const std::string& bytes) {
  static const char* table = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t v = (uint8_t(bytes[i]) << 16) | (uint8_t(bytes[i + 1]) << 8) | uint8_t(bytes[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out += table[(v >> s) & 63];
  }
  if (i + 1 == bytes.size()) {
    const uint32_t v = uint8_t(bytes[i]) << 16;
    out += table[(v >> 18) & 63];
    out += table[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == bytes.size()) {
    const uint32_t v = (uint8_t(bytes[i]) << 16) | (uint8_t(bytes[i + 1]) << 8);
    out += table[(v >> 18) & 63];
    out += table[(v >> 12) & 63];
    out += table[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

std::string escape_html(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

/// Inline text inside a <script> or <style> element must not close it early
/// (element: "script" or "style"; the check is case-insensitive).
std::string_view inline_asset(std::string_view text, const std::string& element) {
  std::string lower(text);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  PK_ASSERT(lower.find("</" + element) == std::string::npos);
  return text;
}

}  // namespace

std::string report_plotting_library() { return std::string(report_assets::plotly_version()); }

std::string png_data_uri(const torch::Tensor& image) {
  PK_CHECK(image.dim() == 3 && (image.size(0) == 1 || image.size(0) == 3),
           "report images must be [C, H, W] with C = 1 or 3 (got " << image.sizes() << ")");
  const torch::Tensor x = image.to(torch::kFloat64);
  const double lo = x.min().item<double>(), hi = x.max().item<double>();
  const double span = hi > lo ? hi - lo : 1.0;
  const int64_t c = x.size(0), h = x.size(1), w = x.size(2);
  // [H, W, C] bytes, min to black and max to white.
  const torch::Tensor px =
      ((x - lo) / span * 255.0).round().clamp(0, 255).to(torch::kUInt8).permute({1, 2, 0}).contiguous();
  std::string bytes;
  const int ok = stbi_write_png_to_func(append, &bytes, static_cast<int>(w), static_cast<int>(h), static_cast<int>(c),
                                        px.data_ptr<uint8_t>(), static_cast<int>(w * c));
  PK_CHECK(ok != 0, "PNG encoding of a " << image.sizes() << " image failed");
  return "data:image/png;base64," + base64(bytes);
}

std::string report_html(const nlohmann::ordered_json& data) {
  std::string json = data.dump();
  // "</" inside a <script> element would end it: JSON may spell it "<\/".
  for (size_t p = json.find("</"); p != std::string::npos; p = json.find("</", p + 3)) json.replace(p, 2, "<\\/");
  const std::string title = escape_html(data.value("title", std::string("pathkernel report")));
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  char when[64];
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  std::string html;
  html.reserve(json.size() + report_assets::plotly_js().size() + 64 * 1024);
  html += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  html += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  html += "<meta name=\"generator\" content=\"pathkernel " + pathkernel_version() + "\">\n";
  html += "<title>" + title + "</title>\n<style>\n";
  html += inline_asset(report_assets::page_css(), "style");
  html += "</style>\n";
  // Errors are collected before anything else runs (the browser test reads them).
  html += "<script>window.__pkErrors = [];\n"
          "window.addEventListener('error', function (e) { window.__pkErrors.push(String(e.message)); "
          "document.body && (document.body.dataset.status = 'error: ' + e.message); });\n"
          "(function () { var ce = console.error; console.error = function () { "
          "window.__pkErrors.push(Array.prototype.join.call(arguments, ' ')); return ce.apply(console, arguments); }; "
          "})();</script>\n";
  html += "<script>/* " + report_plotting_library() + " (MIT licence), inlined */\n";
  html += inline_asset(report_assets::plotly_js(), "script");
  html += "\n</script>\n";
  html += "<script type=\"application/json\" id=\"pk-data\">" + json + "</script>\n";
  html += "</head>\n<body data-status=\"loading\">\n<header><h1>" + title + "</h1><p>written by pathkernel " +
          escape_html(pathkernel_version()) + " on " + when + "; self-contained, opens offline</p></header>\n";
  html += "<main id=\"pk-main\"></main>\n<script>\n";
  html += inline_asset(report_assets::page_js(), "script");
  html += "\n</script>\n</body>\n</html>\n";
  return html;
}

size_t write_report(PathReader& reader, const ReportOptions& options, const std::string& path) {
  const std::string html = report_html(report_data(reader, options));
  write_file_atomic(path, html);
  return html.size();
}

}  // namespace pathkernel
