// oneDNN's prepacked linear layer, which libtorch registers with its dispatcher
// (`mkldnn::_reorder_linear_weight`, `mkldnn::_linear_pointwise`: what `torch.compile` emits for
// CPU linears) but tch does not wrap. With a weight reordered once, a decode step's products cost
// at 8 rows what they cost at one; through `at::linear` twice that (see host/policy/src/packed.rs).
//
// C++ exceptions must not cross into Rust: every entry point catches them and returns the message.

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>
#include <c10/core/GradMode.h>

#include <cstdint>
#include <cstring>
#include <exception>
#include <optional>
#include <stdexcept>
#include <string>

namespace {

void write_error(const char* message, char* err, size_t err_len) {
  if (err == nullptr || err_len == 0) return;
  std::strncpy(err, message, err_len - 1);
  err[err_len - 1] = '\0';
}

// A registered operator; throws when this libtorch lacks it.
c10::OperatorHandle op(const char* name) {
  auto handle = c10::Dispatcher::singleton().findSchema({name, ""});
  if (!handle.has_value()) {
    throw std::runtime_error(std::string("this libtorch has no operator ") + name + " (built without oneDNN?)");
  }
  return *handle;
}

// Runs `body`, which stores its result in `*out`; 0 on success, 1 with the message in `err`.
template <typename F>
int guarded(F body, char* err, size_t err_len) {
  try {
    c10::AutoGradMode no_grad(false);
    body();
    return 0;
  } catch (const std::exception& e) {
    write_error(e.what(), err, err_len);
  } catch (...) {
    write_error("unknown C++ exception", err, err_len);
  }
  return 1;
}

}  // namespace

extern "C" {

// `weight` `[out, in]` reordered for oneDNN's linear, tuned for `batch` rows an input.
int toolsmith_pack_linear_weight(const at::Tensor* weight, int64_t batch, at::Tensor** out, char* err,
                                 size_t err_len) {
  return guarded(
      [&] {
        static const c10::OperatorHandle reorder = op("mkldnn::_reorder_linear_weight");
        torch::jit::Stack stack;
        stack.emplace_back(weight->contiguous());
        stack.emplace_back(batch);
        reorder.callBoxed(&stack);
        *out = new at::Tensor(stack.at(0).toTensor());
      },
      err, err_len);
}

// `x W^T + bias` for `x` `[.., in]` and a weight from `toolsmith_pack_linear_weight`; `bias` may
// be null.
int toolsmith_packed_linear(const at::Tensor* x, const at::Tensor* packed, const at::Tensor* bias,
                            at::Tensor** out, char* err, size_t err_len) {
  return guarded(
      [&] {
        static const c10::OperatorHandle linear = op("mkldnn::_linear_pointwise");
        torch::jit::Stack stack;
        stack.emplace_back(x->contiguous());
        stack.emplace_back(*packed);
        if (bias != nullptr) {
          stack.emplace_back(*bias);
        } else {
          stack.emplace_back(c10::IValue());
        }
        stack.emplace_back(std::string("none"));
        stack.emplace_back(c10::List<std::optional<at::Scalar>>());
        stack.emplace_back(c10::IValue());
        linear.callBoxed(&stack);
        *out = new at::Tensor(stack.at(0).toTensor());
      },
      err, err_len);
}

}  // extern "C"
