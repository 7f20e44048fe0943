// gnuplot as a subprocess: data files, the script, and the PNG.
#include "pathkernel/plot.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "pathkernel/error.h"
#include "pathkernel/files.h"

namespace pathkernel {

namespace {
/// `s` quoted for /bin/sh.
std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}
}  // namespace

std::string gnuplot_command() {
  const char* env = std::getenv("PATHKERNEL_GNUPLOT");
  return env != nullptr && *env != '\0' ? env : "gnuplot";
}

void render(const Figure& figure) {
  namespace fs = std::filesystem;
  PK_CHECK(!figure.png.empty(), "render: the figure has no output path");
  PK_CHECK(figure.width > 0 && figure.height > 0,
           "render: figure size must be positive (got " << figure.width << "x" << figure.height << ")");
  const fs::path png(figure.png);
  const fs::path dir = png.parent_path().empty() ? fs::path(".") : png.parent_path();
  fs::create_directories(dir);
  for (const auto& [name, contents] : figure.data) write_file_atomic((dir / name).string(), contents);
  const std::string stem = png.stem().string();
  const std::string tmp = png.filename().string() + ".tmp." + std::to_string(::getpid());
  std::ostringstream gp;
  gp << "set terminal pngcairo enhanced size " << figure.width << "," << figure.height << " font 'sans,10'\n"
     << "set output '" << tmp << "'\n"
     << figure.script << "\nunset output\n";
  const std::string script = stem + ".gp";
  write_file_atomic((dir / script).string(), gp.str());
  const std::string log = stem + ".gp.log";
  const std::string command = gnuplot_command() + " " + script;
  const std::string shell = "cd " + shell_quote(dir.string()) + " && " + command + " > " + log + " 2>&1";
  const int status = std::system(shell.c_str());
  const int code = status == -1 ? -1 : (WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  std::string messages;
  std::error_code ec;
  if (fs::exists(dir / log, ec)) messages = read_file((dir / log).string());
  fs::remove(dir / log, ec);
  const fs::path out = dir / tmp;
  if (code != 0 || !fs::exists(out, ec) || fs::file_size(out, ec) == 0) {
    fs::remove(out, ec);
    PK_THROW("cannot draw '" << figure.png << "': the command '" << command << "' (run in '" << dir.string()
                             << "') exited with status " << code
                             << (code == 127 ? " (command not found: install gnuplot, e.g. apt-get install "
                                               "gnuplot-nox, or set PATHKERNEL_GNUPLOT)"
                                             : "")
                             << (code == 0 ? " but wrote no image" : "")
                             << (messages.empty() ? std::string() : ":\n" + messages));
  }
  fs::rename(out, png);
}

std::string data_table(const std::vector<std::string>& header, const std::vector<torch::Tensor>& columns) {
  PK_CHECK(header.size() == columns.size(),
           "data_table: " << header.size() << " column names for " << columns.size() << " columns");
  std::vector<torch::Tensor> cols;
  int64_t rows = -1;
  for (size_t j = 0; j < columns.size(); ++j) {
    torch::Tensor c = columns[j].to(torch::kFloat64).reshape(-1).contiguous();
    PK_CHECK(rows < 0 || c.size(0) == rows, "data_table: column '" << header[j] << "' has " << c.size(0)
                                                                     << " rows, expected " << rows);
    rows = c.size(0);
    cols.push_back(c);
  }
  std::string out = "#";
  for (const auto& h : header) out += " " + h;
  out += "\n";
  char buf[32];
  for (int64_t i = 0; i < rows; ++i) {
    for (size_t j = 0; j < cols.size(); ++j) {
      std::snprintf(buf, sizeof buf, "%.17g", cols[j].data_ptr<double>()[i]);
      if (j) out += ' ';
      out += buf;
    }
    out += '\n';
  }
  return out;
}

}  // namespace pathkernel
