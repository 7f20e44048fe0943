// pathkernel's C++ API in one include: train a network and record its path,
// replay it, decompose its predictions exactly into per-training-point
// contributions, and analyse the learned kernel.
//
// The headers below are the ones a user of the library calls; the engine's
// internals (segment evaluation, kink search, quadrature rules, update maps)
// are reachable through them but need not be included directly.
// examples/cpp/train_and_decompose.cpp shows the main path through the API.
#pragma once

#include "pathkernel/dataset.h"         // datasets by name; Dataset
#include "pathkernel/decomposition.h"   // decompose(), summarize(), relative_error()
#include "pathkernel/environment.h"     // the machine bit-for-bit replay depends on
#include "pathkernel/error.h"           // pathkernel::Error, thrown for every user error
#include "pathkernel/evaluate.h"        // attribution methods tested against retraining
#include "pathkernel/explain_directory.h"  // explain.json and contributions.npy, typed, written and read
#include "pathkernel/explanation.h"     // explain(), explain_metagradient()
#include "pathkernel/gp.h"              // Gaussian-process regression on a kernel
#include "pathkernel/gram.h"            // EPK / DPK / NTK Gram matrices
#include "pathkernel/infinite_width.h"  // the infinite-width NTK / NNGP
#include "pathkernel/kernel_regression.h"
#include "pathkernel/loss.h"            // the losses (cross_entropy, nll, mse), computed
#include "pathkernel/sequence.h"        // sequence data sets: outputs [n, T, V], one position decomposed
#include "pathkernel/manifest.h"        // manifest.json
#include "pathkernel/model.h"           // model specs and networks
#include "pathkernel/npy.h"             // reading and writing .npy
#include "pathkernel/objective.h"       // output maps and loss kinds, by name
#include "pathkernel/optimizer.h"       // optimizer options
#include "pathkernel/path.h"            // PathReader: exact replay of a recorded path
#include "pathkernel/run.h"             // train_run(), resume_run()
#include "pathkernel/svm_refit.h"       // an SVM refit on a precomputed kernel
#include "pathkernel/test_points.h"     // choosing test points
#include "pathkernel/trainer.h"         // TrainOptions, train()
#include "pathkernel/version.h"
