// Guards: the Python-side state a C++ plan was made under (dualk/core/guards.py), and the
// garbage-collector support of a pybind11 class that holds Python objects. Python and pybind11
// only (no torch, no CUDA): tests/test_guards.py builds it on the CPU into a probe extension
// (tests/cpp/guards_probe.cpp) to check it against the Python test and the collector.
#pragma once

#include <pybind11/pybind11.h>

#include <vector>

namespace dualk {

namespace py = pybind11;

// The Python-side state a plan was made under (dualk/core/guards.py Guards, whose hold() is the
// same test in Python), read afresh on every call: identities: (dict, key, value), dict[key] is
// value with the key present; absent: (dict, key), the key missing or None; empty: dicts that
// must stay empty (hooks); sizes: (dict, length); calls: (callable, result), callable() is
// result (a switch, a context variable's value).
struct Guards {
  struct Identity {
    py::dict dict;
    py::object key;
    py::object value;
  };
  struct Absent {
    py::dict dict;
    py::object key;
  };
  struct Size {
    py::dict dict;
    Py_ssize_t size;
  };
  struct Call {
    py::object fn;
    py::object result;
  };

  std::vector<py::dict> empty;
  std::vector<Identity> identities;
  std::vector<Absent> absent;
  std::vector<Size> sizes;
  std::vector<Call> calls;

  // guards: Guards.args()'s tuple (identities, absent, empty, sizes, calls)
  void extend(const py::tuple& guards) {
    if (guards.size() != 5) throw py::value_error("dualk plan guards: 5 lists expected");
    for (const auto& item : guards[0].cast<py::list>()) {
      const auto triple = item.cast<py::tuple>();
      identities.push_back({triple[0].cast<py::dict>(),
                            py::reinterpret_borrow<py::object>(triple[1]),
                            py::reinterpret_borrow<py::object>(triple[2])});
    }
    for (const auto& item : guards[1].cast<py::list>()) {
      const auto pair = item.cast<py::tuple>();
      absent.push_back({pair[0].cast<py::dict>(), py::reinterpret_borrow<py::object>(pair[1])});
    }
    for (const auto& item : guards[2].cast<py::list>()) empty.push_back(item.cast<py::dict>());
    for (const auto& item : guards[3].cast<py::list>()) {
      const auto pair = item.cast<py::tuple>();
      sizes.push_back({pair[0].cast<py::dict>(), pair[1].cast<Py_ssize_t>()});
    }
    for (const auto& item : guards[4].cast<py::list>()) {
      const auto pair = item.cast<py::tuple>();
      calls.push_back({py::reinterpret_borrow<py::object>(pair[0]),
                       py::reinterpret_borrow<py::object>(pair[1])});
    }
  }

  // Leaves no Python error set: a lookup or a call that raises an Exception counts as changed.
  bool hold() const {
    for (const auto& d : empty)
      if (PyDict_GET_SIZE(d.ptr()) != 0) return false;
    for (const auto& id : identities) {
      PyObject* now = PyDict_GetItemWithError(id.dict.ptr(), id.key.ptr());
      if (now != id.value.ptr()) {
        if (now == nullptr) PyErr_Clear();
        return false;
      }
    }
    for (const auto& a : absent) {
      PyObject* now = PyDict_GetItemWithError(a.dict.ptr(), a.key.ptr());
      if (now == nullptr && PyErr_Occurred()) {
        PyErr_Clear();
        return false;
      }
      if (now != nullptr && now != Py_None) return false;
    }
    for (const auto& sz : sizes)
      if (PyDict_GET_SIZE(sz.dict.ptr()) != sz.size) return false;
    for (const auto& c : calls) {
      PyObject* now = PyObject_CallNoArgs(c.fn.ptr());
      if (now == nullptr) {
        // an Exception counts as changed; KeyboardInterrupt and the like reach the caller
        // (as Guards.hold lets them)
        if (!PyErr_ExceptionMatches(PyExc_Exception)) throw py::error_already_set();
        PyErr_Clear();
        return false;
      }
      const bool same = now == c.result.ptr();
      Py_DECREF(now);
      if (!same) return false;
    }
    return true;
  }

  // The garbage collector's view (plan_gc_type_setup): every Python object held here.
  int traverse(visitproc visit, void* arg) const {
    for (const auto& d : empty) Py_VISIT(d.ptr());
    for (const auto& id : identities) {
      Py_VISIT(id.dict.ptr());
      Py_VISIT(id.key.ptr());
      Py_VISIT(id.value.ptr());
    }
    for (const auto& a : absent) {
      Py_VISIT(a.dict.ptr());
      Py_VISIT(a.key.ptr());
    }
    for (const auto& sz : sizes) Py_VISIT(sz.dict.ptr());
    for (const auto& c : calls) {
      Py_VISIT(c.fn.ptr());
      Py_VISIT(c.result.ptr());
    }
    return 0;
  }

  void clear() {
    empty.clear();
    identities.clear();
    absent.clear();
    sizes.clear();
    calls.clear();
  }
};

// py::custom_type_setup for a class T holding Python objects (T::traverse(visit, arg) visits
// them all, T::clear() drops them): without it a cycle through T (a plan holding the
// __dict__ of the module that holds the plan) is never collected, module and GPU weights
// included. The instance's value may not be constructed yet when the collector looks (between
// allocation and __init__): then there is nothing to visit.
template <typename T> T* held_value(PyObject* self) {
  try {
    return &py::cast<T&>(py::handle(self));
  } catch (const py::cast_error&) {
    return nullptr;
  }
}

template <typename T> py::custom_type_setup plan_gc_type_setup() {
  return py::custom_type_setup([](PyHeapTypeObject* heap_type) {
    auto* type = &heap_type->ht_type;
    type->tp_flags |= Py_TPFLAGS_HAVE_GC;
    type->tp_traverse = [](PyObject* self, visitproc visit, void* arg) -> int {
      Py_VISIT(Py_TYPE(self));  // (a heap type's instances own a reference to it)
      T* value = held_value<T>(self);
      return value == nullptr ? 0 : value->traverse(visit, arg);
    };
    type->tp_clear = [](PyObject* self) -> int {
      if (T* value = held_value<T>(self)) value->clear();
      return 0;
    };
  });
}

}  // namespace dualk
