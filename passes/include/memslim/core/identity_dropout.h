//===- identity_dropout.h - dropouts that are the identity, any view ==//
//
// What: whether a functional dropout (aten::dropout, feature_dropout,
// alpha_dropout, feature_alpha_dropout) has a constant p of 0 or a constant
// train of false, so its output is its input: ATen's _dropout_impl returns the
// input tensor itself then, and draws no random number. Such a node is removed (its
// readers read the input).
// Why: torchvision's ViT (dropout=0.0 by default), BERT and GPT-2 configs with
// their dropouts at 0 keep them in the model. Eager keeps nothing for them, but
// TorchScript's autodiff differentiates aten::dropout through native_dropout,
// which keeps a 1-byte mask per element even at p == 0 (measured: vit_b_16
// scripted keeps 25 (B, 17, 768) bool masks eager does not).
// Cost: frees the mask TorchScript's executor keeps (CostPolicy::
// dropout_mask_bytes per element), and the dropout's output where a reader
// keeps it while something else keeps its input (autodiff's dropout output is
// a copy); adds no work (one op less).
// Only the TorchScript front end runs it: a torch.export program runs ATen's
// dropout eagerly, which keeps nothing at p == 0.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "memslim/core/decision.h"
#include "memslim/core/graph_view.h"

namespace memslim {

inline constexpr const char* kIdentityDropoutPass = "remove-identity-dropouts";

// Whether `n` is a functional dropout whose constants make it the identity
// (saved::dropout_is_identity; in-place dropouts are left: their schema says
// they write).
bool is_identity_dropout(const GraphView& g, NodeRef n);

// The record for removing identity dropout `n` (always Rewrote: one op less,
// nothing more kept); `policy.dropout_mask_bytes` must be resolved (>= 0).
Decision decide_identity_dropout(const GraphView& g, NodeRef n, const CostPolicy& policy);

} // namespace memslim
