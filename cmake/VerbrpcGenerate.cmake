# VerbrpcGenerate.cmake: verbrpc_generate(), which turns .proto files into C
# with protoc, protoc-c and protoc-gen-verbrpc. Works in verbrpc's own tree
# and from an installed verbrpc (find_package(verbrpc) includes this file).
#
#   verbrpc_generate(<out-var> PROTOS a.proto [b.proto ...]
#                    [IMPORT_DIRS dir ...] [OUT_DIR dir] [EXPORT_MACRO name])
#
# For each a.proto it generates, in OUT_DIR (default
# ${CMAKE_CURRENT_BINARY_DIR}/verbrpc_gen), protoc-c's a.pb-c.h/.c and
# verbrpc's a.vrpc.h/.c, at the path protoc gives the file relative to the
# import directory that holds it (a.proto outside every IMPORT_DIRS is taken
# relative to its own directory). Imports that are not in PROTOS but live in
# the protobuf include directory (google/protobuf/timestamp.proto, empty.proto,
# ... and what they import) are generated with protoc-c too: protobuf-c ships
# no C code for them. <out-var> receives every generated .c and .h;
# <out-var>_INCLUDE_DIRS receives OUT_DIR, to add to the target's include
# directories. Outputs are regenerated when a .proto in PROTOS or the plugin
# changes; adding an import of a well-known type re-runs CMake's configure step
# (the .proto files are configure dependencies).
# List every .proto of yours that the others import: each one's C code is
# generated once, where it is listed. Two calls in one directory share the
# generated well-known-type files; don't link both sets into one program.
include_guard(GLOBAL)

find_program(VERBRPC_PROTOC protoc DOC "protoc, the protobuf compiler")
find_program(VERBRPC_PROTOC_GEN_C protoc-gen-c DOC "protobuf-c's protoc plugin")
find_path(VERBRPC_PROTO_INCLUDE_DIR google/protobuf/timestamp.proto
  PATHS /usr/include /usr/local/include
  DOC "directory holding google/protobuf/*.proto (Debian: libprotobuf-dev)")

# _verbrpc_scan_imports(<out-var> <file>): the import paths a .proto names.
function(_verbrpc_scan_imports out_var file)
  file(STRINGS "${file}" lines REGEX "^[ \t]*import[ \t]")
  set(result "")
  foreach(line IN LISTS lines)
    if(line MATCHES "^[ \t]*import[ \t]+(public[ \t]+|weak[ \t]+)?\"([^\"]+)\"")
      list(APPEND result "${CMAKE_MATCH_2}")
    endif()
  endforeach()
  set(${out_var} "${result}" PARENT_SCOPE)
endfunction()

function(verbrpc_generate out_var)
  cmake_parse_arguments(G "" "OUT_DIR;EXPORT_MACRO" "PROTOS;IMPORT_DIRS" ${ARGN})
  if(G_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "verbrpc_generate: unknown arguments: ${G_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT G_PROTOS)
    message(FATAL_ERROR "verbrpc_generate: no PROTOS given")
  endif()
  foreach(tool VERBRPC_PROTOC VERBRPC_PROTOC_GEN_C VERBRPC_PROTO_INCLUDE_DIR)
    if(NOT ${tool})
      message(FATAL_ERROR "verbrpc_generate: ${tool} not found (Debian: apt install protobuf-compiler "
        "protobuf-c-compiler libprotobuf-dev)")
    endif()
  endforeach()
  if(TARGET protoc-gen-verbrpc)
    set(plugin "$<TARGET_FILE:protoc-gen-verbrpc>")
    set(plugin_dep protoc-gen-verbrpc)
  elseif(TARGET verbrpc::protoc-gen-verbrpc)
    set(plugin "$<TARGET_FILE:verbrpc::protoc-gen-verbrpc>")
    set(plugin_dep "$<TARGET_FILE:verbrpc::protoc-gen-verbrpc>")
  else()
    message(FATAL_ERROR "verbrpc_generate: protoc-gen-verbrpc is not known here: call find_package(verbrpc) first")
  endif()
  if(G_OUT_DIR)
    get_filename_component(out "${G_OUT_DIR}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_BINARY_DIR}")
  else()
    set(out "${CMAKE_CURRENT_BINARY_DIR}/verbrpc_gen")
  endif()
  set(plugin_opts "protoc_c=${VERBRPC_PROTOC_GEN_C}")
  if(G_EXPORT_MACRO)
    string(APPEND plugin_opts ",export_macro=${G_EXPORT_MACRO}")
  endif()

  set(import_dirs "")
  foreach(d IN LISTS G_IMPORT_DIRS)
    get_filename_component(d "${d}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_SOURCE_DIR}")
    list(APPEND import_dirs "${d}")
  endforeach()

  # Where each .proto lives for protoc: (import root, name relative to it).
  set(abs_protos "")
  set(rel_protos "")
  set(roots "")
  foreach(p IN LISTS G_PROTOS)
    get_filename_component(abs "${p}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_SOURCE_DIR}")
    set(rel "")
    foreach(d IN LISTS import_dirs)
      string(LENGTH "${d}/" dlen)
      string(SUBSTRING "${abs}" 0 ${dlen} head)
      if(head STREQUAL "${d}/")
        string(SUBSTRING "${abs}" ${dlen} -1 rel)
        break()
      endif()
    endforeach()
    if(rel STREQUAL "")
      get_filename_component(root "${abs}" DIRECTORY)
      get_filename_component(rel "${abs}" NAME)
      list(APPEND roots "${root}")
    endif()
    list(APPEND abs_protos "${abs}")
    list(APPEND rel_protos "${rel}")
  endforeach()
  list(APPEND import_dirs ${roots})
  list(REMOVE_DUPLICATES import_dirs)
  set(iflags "")
  foreach(d IN LISTS import_dirs)
    list(APPEND iflags "-I${d}")
  endforeach()
  list(APPEND iflags "-I${VERBRPC_PROTO_INCLUDE_DIR}")
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${abs_protos})

  set(outputs "")
  set(system_imports "")
  list(LENGTH abs_protos n)
  math(EXPR last "${n} - 1")
  foreach(i RANGE ${last})
    list(GET abs_protos ${i} abs)
    list(GET rel_protos ${i} rel)
    string(REGEX REPLACE "\\.proto$" "" base "${rel}")
    set(gen "${out}/${base}.pb-c.c" "${out}/${base}.pb-c.h" "${out}/${base}.vrpc.c" "${out}/${base}.vrpc.h")
    add_custom_command(OUTPUT ${gen}
      COMMAND ${CMAKE_COMMAND} -E make_directory "${out}"
      COMMAND "${VERBRPC_PROTOC}" ${iflags}
              "--plugin=protoc-gen-verbrpc=${plugin}" "--verbrpc_out=${plugin_opts}:${out}" "${abs}"
      DEPENDS ${abs_protos} ${plugin_dep} "${VERBRPC_PROTOC_GEN_C}"
      COMMENT "protoc-gen-verbrpc: ${rel}"
      VERBATIM)
    list(APPEND outputs ${gen})
    _verbrpc_scan_imports(imports "${abs}")
    list(APPEND system_imports ${imports})
  endforeach()

  # Imports found in the protobuf include directory and not listed in PROTOS,
  # with what they import in turn.
  set(todo ${system_imports})
  set(wkt "")
  while(todo)
    list(POP_FRONT todo imp)
    # protoc-c itself skips protobuf-c.proto (its options only).
    if(imp IN_LIST rel_protos OR imp IN_LIST wkt OR imp STREQUAL "protobuf-c/protobuf-c.proto"
       OR NOT EXISTS "${VERBRPC_PROTO_INCLUDE_DIR}/${imp}")
      continue()
    endif()
    list(APPEND wkt "${imp}")
    _verbrpc_scan_imports(more "${VERBRPC_PROTO_INCLUDE_DIR}/${imp}")
    list(APPEND todo ${more})
  endwhile()
  get_property(done DIRECTORY PROPERTY _VERBRPC_WKT_RULES)
  foreach(imp IN LISTS wkt)
    string(REGEX REPLACE "\\.proto$" "" base "${imp}")
    set(gen "${out}/${base}.pb-c.c" "${out}/${base}.pb-c.h")
    if(NOT "${out}/${base}" IN_LIST done)
      add_custom_command(OUTPUT ${gen}
        COMMAND ${CMAKE_COMMAND} -E make_directory "${out}"
        COMMAND "${VERBRPC_PROTOC}" "-I${VERBRPC_PROTO_INCLUDE_DIR}"
                "--plugin=protoc-gen-c=${VERBRPC_PROTOC_GEN_C}" "--c_out=${out}" "${imp}"
        DEPENDS "${VERBRPC_PROTO_INCLUDE_DIR}/${imp}" "${VERBRPC_PROTOC_GEN_C}"
        COMMENT "protoc-c: ${imp}"
        VERBATIM)
      set_property(DIRECTORY APPEND PROPERTY _VERBRPC_WKT_RULES "${out}/${base}")
    endif()
    list(APPEND outputs ${gen})
  endforeach()

  set(${out_var} ${outputs} PARENT_SCOPE)
  set(${out_var}_INCLUDE_DIRS "${out}" PARENT_SCOPE)
endfunction()
