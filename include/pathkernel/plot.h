// Figures: PNGs drawn by gnuplot (Debian's gnuplot-nox, pngcairo terminal)
// run as a subprocess. Beside each PNG stay its data files and its .gp
// script, so a figure can be restyled by hand and redrawn with `gnuplot`.
//
// Data files are whitespace-separated columns, one row per line, with a
// `#`-prefixed header line. Everything is written atomically; the PNG appears
// under its name only once gnuplot has finished it.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

namespace pathkernel {

/// One figure to draw.
struct Figure {
  std::string png;     ///< output path, e.g. "out/fig4.png"
  /// gnuplot commands drawing the figure; the terminal and output are set
  /// before them. Data files are referred to by their bare names.
  std::string script;
  /// Data files written beside the PNG: (file name, contents).
  std::vector<std::pair<std::string, std::string>> data;
  int width = 900, height = 600;  ///< pixels
};

/// The gnuplot command: $PATHKERNEL_GNUPLOT if set, else "gnuplot".
std::string gnuplot_command();

/// Writes the data files and PNG.gp (named after the PNG without its
/// extension), runs gnuplot in the PNG's directory and moves its output into
/// place. Throws Error naming the command, its exit status and gnuplot's
/// messages when gnuplot is missing or fails, or writes no image.
void render(const Figure& figure);

/// Columns as a gnuplot data table: columns are 1-D tensors of equal length
/// (any numeric dtype), header the column names. Throws Error on a size mismatch.
std::string data_table(const std::vector<std::string>& header, const std::vector<torch::Tensor>& columns);

}  // namespace pathkernel
