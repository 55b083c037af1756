// main() of the minimal Catch2 stand-in (catch2/catch_test_macros.hpp). Arguments select tests
// by name or tag (a part of either); `~name` or `~[tag]` deselects.
#include "catch2/catch_test_macros.hpp"

#include <cstdio>
#include <cstring>
#include <exception>

int main(int argc, char** argv) {
    int failed = 0, passed = 0, skipped = 0;
    for (auto& t : ferrodnn_catch::registry()) {
        // Arguments: a name or tag (part) selects, `~` before one deselects; no selecting
        // argument selects every test.
        bool any_include = false, included = false, excluded = false;
        for (int i = 1; i < argc; i++) {
            bool exclude = argv[i][0] == '~';
            const char* pat = exclude ? argv[i] + 1 : argv[i];
            bool hit = t.name.find(pat) != std::string::npos || t.tags.find(pat) != std::string::npos;
            if (exclude) {
                excluded |= hit;
            } else {
                any_include = true;
                included |= hit;
            }
        }
        bool wanted = (!any_include || included) && !excluded;
        if (!wanted) continue;
        try {
            t.fn();
            std::printf("PASS %s\n", t.name.c_str());
            passed++;
        } catch (ferrodnn_catch::Skip& e) {
            std::printf("SKIP %s: %s\n", t.name.c_str(), e.what());
            skipped++;
        } catch (std::exception& e) {
            std::printf("FAIL %s: %s\n", t.name.c_str(), e.what());
            failed++;
        } catch (...) {
            std::printf("FAIL %s: an exception that is not a std::exception\n", t.name.c_str());
            failed++;
        }
        std::fflush(stdout);
    }
    std::printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed;
}
