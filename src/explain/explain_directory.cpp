// The explain directory (explain_directory.h): explain.json spelled out and
// read back, contributions.npy and kernel.npy, and the PNG grids.
#include "pathkernel/explain_directory.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>

#include "pathkernel/error.h"
#include "pathkernel/files.h"
#include "pathkernel/image.h"
#include "pathkernel/json_number.h"
#include "pathkernel/loss.h"
#include "pathkernel/npy.h"

namespace pathkernel {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;
using json = nlohmann::json;

namespace {

std::vector<double> values_of(const torch::Tensor& t) {
  const torch::Tensor c = t.contiguous();
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

ojson label_json(const Label& label) {
  if (!label.tokens.empty()) return label.tokens;
  if (!label.target.empty()) return label.target;
  return label.class_index;
}

ojson ranked_json(const std::vector<RankedPoint>& side) {
  ojson out = ojson::array();
  for (const RankedPoint& r : side) {
    ojson e{{"index", r.index}, {"label", label_json(r.label)}, {"value", r.value}};
    if (!r.layers.empty()) e["layers"] = r.layers;
    if (!r.text.empty()) e["text"] = r.text;
    out.push_back(std::move(e));
  }
  return out;
}

ojson point_json(const ExplainedPoint& p, ExplainMethod method) {
  if (method == ExplainMethod::Metagradient) {
    return {{"test_index", p.test_index},
            {"label", label_json(p.label)},
            {"predicted", p.predicted},
            {"output", p.output},
            {"f_final", p.f_final},
            {"metagradient_sum", p.metagradient_sum},
            {"proponents", ranked_json(p.proponents)},
            {"opponents", ranked_json(p.opponents)}};
  }
  ojson out{{"test_index", p.test_index},
            {"label", p.labelled ? label_json(p.label) : ojson(nullptr)},
            {"predicted", p.predicted},
            {"f_final", p.f_final},
            {"f_initial", p.f_initial},
            {"contributions_sum", p.contributions_sum},
            {"regularization", p.regularization},
            {"rounding", p.rounding}};
  if (!p.statistics.empty()) out["statistics"] = p.statistics;  // BatchNorm's running-statistics term S
  out["completeness_error"] = p.completeness_error;
  out["proponents"] = ranked_json(p.proponents);
  out["opponents"] = ranked_json(p.opponents);
  if (p.position >= 0) out["position"] = p.position;
  if (!p.text.empty()) out["text"] = p.text;
  return out;
}

ojson points_json(const ExplainDocument& doc) {
  ojson points = ojson::array();
  for (const ExplainedPoint& p : doc.points) points.push_back(point_json(p, doc.method));
  return points;
}

ojson check_json(const MetagradientCheckEntry& c) {
  ojson points = ojson::array();
  for (const MetagradientCheckEntry::Point& p : c.points) {
    points.push_back({{"index", p.index}, {"metagradient", p.metagradient}, {"finite_differences", p.finite_differences}});
  }
  return {{"method", "central finite differences of retraining with the loss weight at c_i ± h and c_i ± h/2, "
                     "Richardson-combined"},
          {"h", c.h},
          {"max_rel_error", c.max_rel_error},
          {"max_rel_spread", c.max_rel_spread},
          {"retrainings", c.retrainings},
          {"seconds", c.seconds},
          {"points", points}};
}

ojson exact_json(const ExplainDocument& doc) {
  const std::optional<ExplainKernelFile>& k = doc.kernel;
  ojson j{{"run", doc.run},
          {"method", "exact"},
          {"quadrature", doc.quadrature},
          {"steps", doc.steps},
          {"certificate_max_gap", doc.certificate_max_gap},
          {"loss", doc.loss},
          {"form", doc.form},
          {"recorded", doc.recorded},
          {"updates_explained", doc.updates_explained},
          {"contributions", {{"file", "contributions.npy"}, {"shape", doc.contributions_shape}}},
          {"kernel", k ? ojson{{"file", "kernel.npy"},
                               {"shape", k->shape},
                               {"single_kernel", k->single_kernel},
                               {"weight", k->weight ? ojson(*k->weight) : ojson(nullptr)}}
                       : ojson(nullptr)},
          {"points", points_json(doc)}};
  if (!doc.warning.empty()) j["warning"] = doc.warning;
  if (!doc.note.empty()) j["note"] = doc.note;
  if (doc.inputs) {
    j["inputs"] = {{"file", "inputs.npy"},
                   {"source", doc.inputs->source},
                   {"shape", doc.inputs->shape},
                   {"labels", doc.inputs->labels_source.empty() ? ojson(nullptr) : ojson("labels.npy")},
                   {"labels_source", doc.inputs->labels_source.empty() ? ojson(nullptr) : ojson(doc.inputs->labels_source)}};
  }
  if (doc.layers) {
    ojson tensors = ojson::array();
    for (const ExplainLayerTensor& t : doc.layers->tensors) tensors.push_back({{"name", t.name}, {"shape", t.shape}});
    j["layer_contributions"] = {{"file", "layer_contributions.npy"}, {"shape", doc.layers->shape}, {"tensors", tensors}};
  }
  return j;
}

ojson metagradient_json(const ExplainDocument& doc) {
  ojson j{{"run", doc.run},
          {"method", "metagradient"},
          {"meaning", "d f(w_N, x) / d c_i: how the trained network's output moves per unit of training "
                      "point i's loss weight, the whole run retrained (first order)"},
          {"outputs", doc.outputs_predicted ? "predicted" : "all"},
          {"steps", doc.steps},
          {"adjoints", doc.adjoints},
          {"hessian_vector_products", doc.hessian_vector_products},
          {"seconds", doc.seconds},
          {"loss", doc.loss},
          {"recorded", doc.recorded},
          {"loss_weights", doc.loss_weights ? ojson(*doc.loss_weights) : ojson(nullptr)},
          {"contributions", {{"file", "contributions.npy"}, {"shape", doc.contributions_shape},
                             {"not_differentiated", doc.outputs_predicted ? "NaN" : "none"}}},
          {"kernel", nullptr},
          {"points", points_json(doc)}};
  if (doc.check) j["check"] = check_json(*doc.check);
  return j;
}

// Reading back.

/// What explain.json holds, parsed, with its path for the messages.
struct JsonFile {
  std::string path;
  json j;
};

/// `v` as a number, or NaN for null (JSON has no NaN: nlohmann writes it as null).
double number_or_nan(const json& v, const std::string& what) {
  return v.is_null() ? std::numeric_limits<double>::quiet_NaN() : json_number<double>(v, what);
}

std::vector<double> numbers_or_nan(const json& v, const std::string& what) {
  PK_CHECK(v.is_array(), what << " must be an array of numbers, got " << v.dump());
  std::vector<double> out;
  for (const auto& e : v) out.push_back(number_or_nan(e, what + " element"));
  return out;
}

/// Field `key` of object `o` read by `read`, or `fallback` when absent.
template <typename T, typename Read>
T field_or(const json& o, const char* key, T fallback, Read read) {
  return o.contains(key) ? read(o[key]) : fallback;
}

Label read_label(const json& v, const std::string& what) {
  Label label;
  const bool tokens = v.is_array() && !v.empty() &&
                      std::all_of(v.begin(), v.end(), [](const json& e) { return e.is_number_integer(); });
  if (tokens) {
    for (const json& e : v) label.tokens.push_back(json_number<int64_t>(e, what));
  } else if (v.is_array()) {
    label.target = numbers_or_nan(v, what);
  } else {
    label.class_index = json_number<int64_t>(v, what);
  }
  return label;
}

std::vector<RankedPoint> read_side(const JsonFile& f, const json& p, const char* side, const Manifest& m) {
  std::vector<RankedPoint> out;
  for (const auto& t : p[side]) {
    PK_CHECK(t.is_object() && t.contains("index"),
             "'" << f.path << "' lists an entry without an index among the " << side << ": " << t.dump());
    RankedPoint r;
    r.index = json_number<int64_t>(t["index"], "'" + f.path + "': an index among the " + std::string(side));
    PK_CHECK(r.index >= 0 && r.index < m.num_train, "'" << f.path << "' lists training point " << r.index
                                                        << " among the " << side << "; the run has " << m.num_train
                                                        << " training points");
    if (t.contains("label")) r.label = read_label(t["label"], "'" + f.path + "': a label among the " + side);
    if (t.contains("value")) r.value = number_or_nan(t["value"], "'" + f.path + "': a value among the " + side);
    if (t.contains("layers")) r.layers = numbers_or_nan(t["layers"], "'" + f.path + "': layers among the " + side);
    if (t.contains("text") && t["text"].is_string()) r.text = t["text"].get<std::string>();
    out.push_back(std::move(r));
  }
  return out;
}

/// A point's test_index lies among the run's test points, or with --inputs the rows of the inputs.
ExplainedPoint read_point(const JsonFile& f, const json& p, const Manifest& m, const ExplainDocument& doc) {
  PK_CHECK(p.is_object() && p.contains("test_index") && p.contains("proponents") && p.contains("opponents") &&
               p.contains("predicted"),
           "'" << f.path << "' has a point without test_index, predicted, proponents or opponents: " << p.dump());
  const std::string where = "'" + f.path + "': a point's ";
  ExplainedPoint e;
  e.test_index = json_number<int64_t>(p["test_index"], where + "test_index");
  const int64_t count = doc.inputs ? doc.inputs->shape.at(0) : m.num_test;
  PK_CHECK(e.test_index >= 0 && e.test_index < count,
           "'" << f.path << "' explains " << (doc.inputs ? "input " : "test point ") << e.test_index << ", but "
               << (doc.inputs ? "the inputs have " : "the run has ") << count
               << (doc.inputs ? " rows" : " test points"));
  e.predicted = json_number<int64_t>(p["predicted"], where + "predicted");
  e.output = p.contains("output") ? json_number<int64_t>(p["output"], where + "output") : e.predicted;
  if (p.contains("label") && p["label"].is_null()) e.labelled = false;
  else if (p.contains("label")) e.label = read_label(p["label"], where + "label");
  auto numbers = [&](const char* key) {
    return field_or(p, key, std::vector<double>(), [&](const json& v) { return numbers_or_nan(v, where + key); });
  };
  if (p.contains("text") && p["text"].is_string()) e.text = p["text"].get<std::string>();
  if (p.contains("position")) e.position = json_number<int64_t>(p["position"], where + "position");
  e.f_final = numbers("f_final");
  e.f_initial = numbers("f_initial");
  e.contributions_sum = numbers("contributions_sum");
  e.regularization = numbers("regularization");
  e.rounding = numbers("rounding");
  e.statistics = numbers("statistics");
  e.metagradient_sum = numbers("metagradient_sum");
  e.completeness_error = field_or(p, "completeness_error", 0.0,
                                  [&](const json& v) { return number_or_nan(v, where + "completeness_error"); });
  e.proponents = read_side(f, p, "proponents", m);
  e.opponents = read_side(f, p, "opponents", m);
  return e;
}

MetagradientCheckEntry read_check(const JsonFile& f, const json& c) {
  const std::string where = "'" + f.path + "': the check's ";
  PK_CHECK(c.is_object(), "'" << f.path << "' has a \"check\" that is not an object: " << c.dump());
  MetagradientCheckEntry entry;
  entry.h = field_or(c, "h", 0.0, [&](const json& v) { return json_number<double>(v, where + "h"); });
  entry.max_rel_error = field_or(c, "max_rel_error", 0.0, [&](const json& v) { return number_or_nan(v, where + "max_rel_error"); });
  entry.max_rel_spread =
      field_or(c, "max_rel_spread", 0.0, [&](const json& v) { return number_or_nan(v, where + "max_rel_spread"); });
  entry.retrainings =
      field_or(c, "retrainings", int64_t{0}, [&](const json& v) { return json_number<int64_t>(v, where + "retrainings"); });
  entry.seconds = field_or(c, "seconds", 0.0, [&](const json& v) { return json_number<double>(v, where + "seconds"); });
  for (const auto& p : field_or(c, "points", json::array(), [](const json& v) { return v; })) {
    PK_CHECK(p.is_object() && p.contains("index"), where << "points need an index: " << p.dump());
    entry.points.push_back({json_number<int64_t>(p["index"], where + "point index"),
                            numbers_or_nan(p.value("metagradient", json::array()), where + "metagradient"),
                            numbers_or_nan(p.value("finite_differences", json::array()), where + "finite_differences")});
  }
  return entry;
}

std::optional<ExplainKernelFile> read_kernel_entry(const JsonFile& f, const json& k) {
  if (k.is_null()) return std::nullopt;
  const std::string where = "'" + f.path + "': the kernel's ";
  PK_CHECK(k.is_object(), "'" << f.path << "' has a \"kernel\" that is neither null nor an object: " << k.dump());
  ExplainKernelFile kernel;
  kernel.shape = field_or(k, "shape", std::vector<int64_t>(),
                          [&](const json& v) { return json_numbers<int64_t>(v, where + "shape"); });
  kernel.single_kernel = k.value("single_kernel", false);
  if (k.contains("weight") && !k["weight"].is_null()) kernel.weight = json_number<double>(k["weight"], where + "weight");
  return kernel;
}

/// The document's fields besides its points.
void read_header(const JsonFile& f, ExplainDocument& doc) {
  const json& j = f.j;
  const std::string where = "'" + f.path + "': ";
  doc.run = j.value("run", std::string());
  doc.method = j.value("method", std::string("exact")) == "metagradient" ? ExplainMethod::Metagradient
                                                                         : ExplainMethod::Exact;
  doc.steps = field_or(j, "steps", int64_t{0}, [&](const json& v) { return json_number<int64_t>(v, where + "steps"); });
  doc.loss = j.value("loss", std::string());
  doc.recorded = j.value("recorded", false);
  if (j.contains("contributions") && j["contributions"].contains("shape")) {
    doc.contributions_shape = json_numbers<int64_t>(j["contributions"]["shape"], where + "the contributions' shape");
  }
  doc.quadrature = j.value("quadrature", std::string());
  doc.certificate_max_gap = field_or(j, "certificate_max_gap", 0.0,
                                     [&](const json& v) { return number_or_nan(v, where + "certificate_max_gap"); });
  doc.form = j.value("form", std::string());
  doc.updates_explained = j.value("updates_explained", true);
  if (j.contains("kernel")) doc.kernel = read_kernel_entry(f, j["kernel"]);
  doc.warning = j.value("warning", std::string());
  doc.note = j.value("note", std::string());
  doc.outputs_predicted = j.value("outputs", std::string("predicted")) == "predicted";
  doc.adjoints = field_or(j, "adjoints", int64_t{0}, [&](const json& v) { return json_number<int64_t>(v, where + "adjoints"); });
  doc.hessian_vector_products = field_or(j, "hessian_vector_products", int64_t{0}, [&](const json& v) {
    return json_number<int64_t>(v, where + "hessian_vector_products");
  });
  doc.seconds = field_or(j, "seconds", 0.0, [&](const json& v) { return json_number<double>(v, where + "seconds"); });
  if (j.contains("loss_weights") && j["loss_weights"].is_string()) doc.loss_weights = j["loss_weights"].get<std::string>();
  if (j.contains("check")) doc.check = read_check(f, j["check"]);
  if (j.contains("layer_contributions")) {
    const json& l = j["layer_contributions"];
    PK_CHECK(l.is_object() && l.contains("shape") && l.contains("tensors") && l["tensors"].is_array(),
             where << "\"layer_contributions\" must be an object with a shape and tensors, got " << l.dump());
    ExplainLayerFile file;
    file.shape = json_numbers<int64_t>(l["shape"], where + "the layer contributions' shape");
    for (const json& t : l["tensors"]) {
      PK_CHECK(t.is_object() && t.contains("name") && t["name"].is_string() && t.contains("shape"),
               where << "a tensor of \"layer_contributions\" needs a name and a shape, got " << t.dump());
      file.tensors.push_back({t["name"].get<std::string>(), json_numbers<int64_t>(t["shape"], where + "a tensor's shape")});
    }
    doc.layers = std::move(file);
  }
}

/// explain.json's "inputs" entry, when it has one.
std::optional<ExplainInputsEntry> read_inputs_entry(const JsonFile& f) {
  if (!f.j.contains("inputs")) return std::nullopt;
  const json& in = f.j["inputs"];
  const std::string where = "'" + f.path + "': ";
  PK_CHECK(in.is_object() && in.contains("shape"), where << "\"inputs\" must be an object with a shape, got " << in.dump());
  ExplainInputsEntry e;
  e.source = in.value("source", std::string());
  e.shape = json_numbers<int64_t>(in["shape"], where + "the inputs' shape");
  PK_CHECK(!e.shape.empty() && e.shape[0] >= 1, where << "the inputs' shape " << in["shape"].dump()
                                                      << " has no rows, expected [n, ...] with n >= 1");
  if (in.contains("labels_source") && in["labels_source"].is_string()) e.labels_source = in["labels_source"].get<std::string>();
  return e;
}

/// DIR/inputs.npy (and labels.npy, when the document names labels), checked against the document.
void read_inputs_copy(const std::string& dir, ExplainDirectory& e) {
  const std::string path = (fs::path(dir) / "inputs.npy").string();
  PK_CHECK(fs::exists(path), "explain directory '" << dir << "' explains inputs but has no inputs.npy");
  e.inputs = read_npy(path);
  PK_CHECK(e.inputs.sizes().vec() == e.document.inputs->shape,
           "'" << path << "' has shape " << e.inputs.sizes() << "; explain.json says "
               << ojson(e.document.inputs->shape).dump());
  if (e.document.inputs->labels_source.empty()) return;
  const std::string lpath = (fs::path(dir) / "labels.npy").string();
  PK_CHECK(fs::exists(lpath), "explain directory '" << dir << "' explains labelled inputs but has no labels.npy");
  e.labels = read_npy(lpath);
  PK_CHECK(e.labels.dim() >= 1 && e.labels.size(0) == e.inputs.size(0),
           "'" << lpath << "' has shape " << e.labels.sizes() << ", expected " << e.inputs.size(0) << " labels");
}

JsonFile read_explain_json(const std::string& dir) {
  PK_CHECK(fs::is_directory(dir), "explain directory '" << dir
                                                        << "' does not exist: expected the directory explain() writes "
                                                        << "('pathkernel explain')");
  JsonFile f;
  f.path = (fs::path(dir) / "explain.json").string();
  PK_CHECK(fs::exists(f.path),
           "explain directory '" << dir << "' has no explain.json: was it written by 'pathkernel explain'?");
  try {
    f.j = json::parse(read_file(f.path));
  } catch (const json::exception& ex) {
    PK_THROW("'" << f.path << "' is not valid JSON (" << ex.what() << "): was it written by 'pathkernel explain'?");
  }
  PK_CHECK(f.j.is_object() && f.j.contains("points") && f.j["points"].is_array() && !f.j["points"].empty(),
           "'" << f.path << "' has no \"points\" list: expected the output of 'pathkernel explain'");
  return f;
}

}  // namespace

std::string Label::str() const { return label_json(*this).dump(); }

Label label_at(const torch::Tensor& labels, int64_t i) {
  Label label;
  if (labels.dim() == 2 && labels.is_floating_point()) {
    label.target = values_of(labels[i].to(torch::kFloat64));
  } else if (labels.dim() == 2) {  // a sequence's tokens
    const torch::Tensor row = labels[i].to(torch::kLong).contiguous();
    label.tokens.assign(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.numel());
  } else {
    label.class_index = labels[i].item<int64_t>();
  }
  return label;
}

std::vector<RankedPoint> ranked_points(const torch::Tensor& c, const torch::Tensor& labels, int64_t k,
                                       bool largest) {
  auto [values, index] = c.topk(std::min<int64_t>(k, c.size(0)), 0, largest);
  std::vector<RankedPoint> out;
  for (int64_t j = 0; j < index.size(0); ++j) {
    const int64_t i = index[j].item<int64_t>();
    out.push_back({i, label_at(labels, i), values[j].item<double>(), {}, {}});
  }
  return out;
}

ojson explain_json(const ExplainDocument& doc) {
  return doc.method == ExplainMethod::Metagradient ? metagradient_json(doc) : exact_json(doc);
}

void write_explain_json(const std::string& dir, const ExplainDocument& doc) {
  write_file_atomic((fs::path(dir) / "explain.json").string(), explain_json(doc).dump(2) + "\n");
}

void write_explain_directory(const std::string& dir, const ExplainDocument& doc, const torch::Tensor& contributions,
                             const torch::Tensor& kernel, const torch::Tensor& layers) {
  fs::create_directories(dir);
  write_npy((fs::path(dir) / "contributions.npy").string(), contributions);
  if (kernel.defined()) write_npy((fs::path(dir) / "kernel.npy").string(), kernel);
  if (layers.defined()) write_npy((fs::path(dir) / "layer_contributions.npy").string(), layers);
  write_explain_json(dir, doc);
}

std::vector<std::string> write_explain_images(const std::string& dir, const Dataset& data,
                                              const std::vector<ExplainedPoint>& points, const torch::Tensor& inputs) {
  std::vector<std::string> pngs;
  const Rgb colours[] = {Rgb{30, 160, 60}, Rgb{210, 40, 40}};
  for (size_t n = 0; n < points.size(); ++n) {
    const ExplainedPoint& p = points[n];
    std::vector<std::vector<GridTile>> rows(2);
    const torch::Tensor x = inputs.defined() ? inputs[static_cast<int64_t>(n)] : test_input(data, p.test_index);
    rows[0].push_back({x, Rgb{40, 90, 220}});
    rows[1].push_back({torch::Tensor(), std::nullopt});
    const std::vector<RankedPoint>* sides[] = {&p.proponents, &p.opponents};
    for (int side = 0; side < 2; ++side) {
      int shown = 0;
      for (const RankedPoint& r : *sides[side]) {
        if (shown++ == 8) break;
        rows[side].push_back({train_input(data, r.index), colours[side]});
      }
    }
    const std::string name =
        std::string(inputs.defined() ? "explain_input_" : "explain_") + std::to_string(p.test_index) + ".png";
    write_png_grid((fs::path(dir) / name).string(), rows);
    pngs.push_back(name);
  }
  return pngs;
}

ExplainDirectory read_explain_directory(const std::string& dir, const Manifest& m) {
  const JsonFile f = read_explain_json(dir);
  ExplainDirectory e;
  const std::string cpath = (fs::path(dir) / "contributions.npy").string();
  PK_CHECK(fs::exists(cpath), "explain directory '" << dir << "' has no contributions.npy");
  e.contributions = read_npy(cpath).to(torch::kFloat64);
  const int64_t count = static_cast<int64_t>(f.j["points"].size());
  PK_CHECK(e.contributions.dim() == 3 && e.contributions.size(0) == count && e.contributions.size(1) == m.num_train &&
               e.contributions.size(2) == m.num_classes,
           "'" << cpath << "' has shape " << e.contributions.sizes() << "; expected [" << count << ", " << m.num_train
               << ", " << m.num_classes << "] (explained points, training points, classes): was it explained from "
               << "this run?");
  std::vector<int64_t> idx;
  e.document.inputs = read_inputs_entry(f);
  for (const auto& p : f.j["points"]) {
    e.document.points.push_back(read_point(f, p, m, e.document));
    idx.push_back(e.document.points.back().test_index);
  }
  read_header(f, e.document);
  if (e.document.inputs) read_inputs_copy(dir, e);
  e.test_index = torch::tensor(idx, torch::kInt64);
  return e;
}

}  // namespace pathkernel
