# Included by CMake right after llama-cpp-python's project() (through
# CMAKE_PROJECT_llama_cpp_INCLUDE, set by scripts/build-engine).
#
# With GGML_BACKEND_DL and GGML_CPU_ALL_VARIANTS, llama.cpp builds its CPU
# backend once per x86-64 (or Arm) feature level, as loadable modules
# (libggml-cpu-haswell.so, libggml-cpu-zen4.so, ...), and the program picks
# one at run time. llama-cpp-python installs only the targets it knows by
# name, so without this file the wheel would carry no CPU backend at all.
# This schedules, for the end of the configure step (when every target
# exists), an install rule that puts each variant next to libggml.so in
# the wheel's llama_cpp/lib, finding libggml-base.so beside it ($ORIGIN).

cmake_language(DEFER DIRECTORY ${CMAKE_SOURCE_DIR} CALL _syntrop_install_cpu_variants)

function(_syntrop_install_cpu_variants)
    set(found 0)
    foreach(backend IN LISTS GGML_AVAILABLE_BACKENDS)
        if(backend MATCHES "^ggml-cpu-")
            set_target_properties(${backend} PROPERTIES
                INSTALL_RPATH "$ORIGIN"
                BUILD_WITH_INSTALL_RPATH TRUE)
            install(TARGETS ${backend}
                LIBRARY DESTINATION ${SKBUILD_PLATLIB_DIR}/llama_cpp/lib)
            math(EXPR found "${found} + 1")
        endif()
    endforeach()
    if(found EQUAL 0)
        message(FATAL_ERROR "syntrop: no CPU backend variants to install "
                            "(GGML_BACKEND_DL and GGML_CPU_ALL_VARIANTS must be ON)")
    endif()
    message(STATUS "syntrop: installing ${found} CPU backend variants into llama_cpp/lib")
endfunction()
