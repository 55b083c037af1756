// A minimal stand-in for Catch2 v3's test macros, enough to build and run the cudnn frontend's
// C++ samples without fetching Catch2: TEST_CASE registers a test, REQUIRE / CHECK / FAIL end
// it with a failure, SKIP with a skip; main() (in catch_main.cpp) runs every test whose name or
// tags contain one of its arguments (all when none), prints one line per test and returns the
// number that failed. Written for ferrodnn's libcudnn tests; not Catch2's code.
#pragma once

#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace ferrodnn_catch {

struct Test {
    std::string name, tags;
    std::function<void()> fn;
};

inline std::vector<Test>& registry() {
    static std::vector<Test> tests;
    return tests;
}

struct Registrar {
    Registrar(void (*fn)(), const char* name, const char* tags = "") { registry().push_back({name, tags, fn}); }
};

struct Failure : std::runtime_error {
    using std::runtime_error::runtime_error;
};
struct Skip : std::runtime_error {
    using std::runtime_error::runtime_error;
};

inline std::string where(const char* file, int line) {
    std::ostringstream s;
    s << file << ":" << line;
    return s.str();
}

}  // namespace ferrodnn_catch

#define FERRODNN_CATCH_CAT2(a, b) a##b
#define FERRODNN_CATCH_CAT(a, b) FERRODNN_CATCH_CAT2(a, b)
#define FERRODNN_CATCH_TEST(fn, ...)                                                                 \
    static void fn();                                                                                \
    static ferrodnn_catch::Registrar FERRODNN_CATCH_CAT(fn, _registrar)(&fn, __VA_ARGS__);      \
    static void fn()
#define TEST_CASE(...) FERRODNN_CATCH_TEST(FERRODNN_CATCH_CAT(ferrodnn_catch_test_, __LINE__), __VA_ARGS__)

#define REQUIRE(...)                                                                                     \
    do {                                                                                                 \
        if (!(__VA_ARGS__))                                                                              \
            throw ferrodnn_catch::Failure(ferrodnn_catch::where(__FILE__, __LINE__) + ": REQUIRE(" #__VA_ARGS__ ") failed"); \
    } while (0)
#define REQUIRE_FALSE(...) REQUIRE(!(__VA_ARGS__))
#define CHECK(...) REQUIRE(__VA_ARGS__)
#define FAIL(msg)                                                                                        \
    do {                                                                                                 \
        std::ostringstream ferrodnn_catch_s;                                                             \
        ferrodnn_catch_s << ferrodnn_catch::where(__FILE__, __LINE__) << ": " << msg;                    \
        throw ferrodnn_catch::Failure(ferrodnn_catch_s.str());                                           \
    } while (0)
#define SKIP(...)                                                                                        \
    do {                                                                                                 \
        std::ostringstream ferrodnn_catch_s;                                                             \
        ferrodnn_catch_s << "" __VA_ARGS__;                                                              \
        throw ferrodnn_catch::Skip(ferrodnn_catch_s.str());                                              \
    } while (0)
#define INFO(msg) ((void)0)
#define SECTION(name) if (true)
