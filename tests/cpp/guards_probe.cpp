// A CPU probe of cuda_src/plan_guards.h for tests/test_guards.py: the C++ Guards::hold that
// MlpPlan runs on every call, checked against the Python test (dualk/core/guards.py), and the
// garbage-collector support MlpPlan uses (plan_gc_type_setup), checked on a cycle through it.
#include <pybind11/pybind11.h>

#include "plan_guards.h"

namespace py = pybind11;

namespace {

// Holds guards and Python objects as MlpPlan does (its weights and biases).
class GuardedHolder {
 public:
  GuardedHolder(const py::tuple& guards, const py::list& objects) {
    guards_.extend(guards);
    for (const auto& o : objects) objects_.push_back(py::reinterpret_borrow<py::object>(o));
  }
  bool hold() const { return !objects_.empty() && guards_.hold(); }
  int traverse(visitproc visit, void* arg) const {
    for (const auto& o : objects_) Py_VISIT(o.ptr());
    return guards_.traverse(visit, arg);
  }
  void clear() {
    objects_.clear();
    guards_.clear();
  }

 private:
  dualk::Guards guards_;
  std::vector<py::object> objects_;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::class_<GuardedHolder>(m, "GuardedHolder", dualk::plan_gc_type_setup<GuardedHolder>())
      .def(py::init<const py::tuple&, const py::list&>())
      .def("hold", &GuardedHolder::hold);
}
