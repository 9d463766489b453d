package dev.jobbroker.client;

import java.math.BigDecimal;
import java.math.BigInteger;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collection;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * The small JSON codec of durable steps, results and progress. The pom has no JSON library and
 * this client adds no dependency for one, so this reads and writes plain values only.
 *
 * <p>Decoded values: {@code null}, {@link Boolean}, {@link String}, {@link Long} (an integer that
 * fits), {@link Double} (any other number), {@code List<Object>} and {@code Map<String, Object>}
 * (key order kept). Encoded values: those, any {@link Number}, {@link Collection}, Object arrays
 * and {@link Map} (keys by {@code toString()}). Anything else is an {@link
 * IllegalArgumentException}: a step result must mean the same to a worker in another language.
 */
public final class Json {
  private Json() {}

  /** {@code value} as UTF-8 JSON bytes. */
  public static byte[] encode(Object value) {
    StringBuilder out = new StringBuilder();
    write(value, out);
    return out.toString().getBytes(StandardCharsets.UTF_8);
  }

  /** {@code value} as JSON text. */
  public static String write(Object value) {
    StringBuilder out = new StringBuilder();
    write(value, out);
    return out.toString();
  }

  /** Decodes UTF-8 JSON bytes; {@link IllegalArgumentException} if they are not one JSON value. */
  public static Object decode(byte[] json) {
    return parse(new String(json, StandardCharsets.UTF_8));
  }

  /** Decodes JSON text; {@link IllegalArgumentException} if it is not one JSON value. */
  public static Object parse(String text) {
    Reader r = new Reader(text);
    r.skipSpace();
    Object v = r.value();
    r.skipSpace();
    if (r.pos != text.length()) {
      throw r.error("text after the value");
    }
    return v;
  }

  private static void write(Object v, StringBuilder out) {
    if (v == null) {
      out.append("null");
    } else if (v instanceof Boolean) {
      out.append(v);
    } else if (v instanceof String s) {
      writeString(s, out);
    } else if (v instanceof Double || v instanceof Float) {
      double d = ((Number) v).doubleValue();
      if (Double.isNaN(d) || Double.isInfinite(d)) {
        throw new IllegalArgumentException("JSON has no " + d);
      }
      // Double.toString is valid JSON for finite values ("1.0", "1.0E-5") and keeps the ".0" of
      // an integral double, so it decodes as a Double again.
      out.append(Double.toString(d));
    } else if (v instanceof BigDecimal b) {
      out.append(b.toString());
    } else if (v instanceof Number) { // Integer, Long, Short, Byte, BigInteger, atomics
      out.append(v);
    } else if (v instanceof Map<?, ?> map) {
      out.append('{');
      boolean first = true;
      for (Map.Entry<?, ?> e : map.entrySet()) {
        if (!first) {
          out.append(',');
        }
        first = false;
        writeString(String.valueOf(e.getKey()), out);
        out.append(':');
        write(e.getValue(), out);
      }
      out.append('}');
    } else if (v instanceof Collection<?> list) {
      writeArray(list, out);
    } else if (v instanceof Object[] array) {
      writeArray(List.of(array), out);
    } else {
      throw new IllegalArgumentException(
          "cannot encode a " + v.getClass().getName() + " as JSON");
    }
  }

  private static void writeArray(Collection<?> list, StringBuilder out) {
    out.append('[');
    boolean first = true;
    for (Object item : list) {
      if (!first) {
        out.append(',');
      }
      first = false;
      write(item, out);
    }
    out.append(']');
  }

  private static void writeString(String s, StringBuilder out) {
    out.append('"');
    for (int i = 0; i < s.length(); i++) {
      char c = s.charAt(i);
      switch (c) {
        case '"' -> out.append("\\\"");
        case '\\' -> out.append("\\\\");
        case '\n' -> out.append("\\n");
        case '\r' -> out.append("\\r");
        case '\t' -> out.append("\\t");
        case '\b' -> out.append("\\b");
        case '\f' -> out.append("\\f");
        default -> {
          if (c < 0x20) {
            out.append(String.format("\\u%04x", (int) c));
          } else {
            out.append(c); // non-ASCII stays as is: the bytes are UTF-8
          }
        }
      }
    }
    out.append('"');
  }

  /** A recursive-descent reader over one JSON text. */
  private static final class Reader {
    private final String text;
    int pos;

    Reader(String text) {
      this.text = text;
    }

    IllegalArgumentException error(String why) {
      return new IllegalArgumentException("not JSON: " + why + " at offset " + pos);
    }

    void skipSpace() {
      while (pos < text.length() && " \t\r\n".indexOf(text.charAt(pos)) >= 0) {
        pos++;
      }
    }

    Object value() {
      if (pos >= text.length()) {
        throw error("unexpected end");
      }
      char c = text.charAt(pos);
      switch (c) {
        case '{':
          return object();
        case '[':
          return array();
        case '"':
          return string();
        case 't':
          return literal("true", Boolean.TRUE);
        case 'f':
          return literal("false", Boolean.FALSE);
        case 'n':
          return literal("null", null);
        default:
          if (c == '-' || (c >= '0' && c <= '9')) {
            return number();
          }
          throw error("unexpected '" + c + "'");
      }
    }

    private Object literal(String word, Object value) {
      if (!text.startsWith(word, pos)) {
        throw error("expected " + word);
      }
      pos += word.length();
      return value;
    }

    private Map<String, Object> object() {
      Map<String, Object> map = new LinkedHashMap<>();
      pos++; // {
      skipSpace();
      if (peek() == '}') {
        pos++;
        return map;
      }
      while (true) {
        skipSpace();
        if (peek() != '"') {
          throw error("expected a key");
        }
        String key = string();
        skipSpace();
        expect(':');
        skipSpace();
        map.put(key, value());
        skipSpace();
        char c = next();
        if (c == '}') {
          return map;
        }
        if (c != ',') {
          throw error("expected ',' or '}'");
        }
      }
    }

    private List<Object> array() {
      List<Object> list = new ArrayList<>();
      pos++; // [
      skipSpace();
      if (peek() == ']') {
        pos++;
        return list;
      }
      while (true) {
        skipSpace();
        list.add(value());
        skipSpace();
        char c = next();
        if (c == ']') {
          return list;
        }
        if (c != ',') {
          throw error("expected ',' or ']'");
        }
      }
    }

    private String string() {
      pos++; // "
      StringBuilder out = new StringBuilder();
      while (true) {
        char c = next();
        if (c == '"') {
          return out.toString();
        }
        if (c < 0x20) {
          throw error("control character in a string");
        }
        if (c != '\\') {
          out.append(c);
          continue;
        }
        char e = next();
        switch (e) {
          case '"', '\\', '/' -> out.append(e);
          case 'n' -> out.append('\n');
          case 'r' -> out.append('\r');
          case 't' -> out.append('\t');
          case 'b' -> out.append('\b');
          case 'f' -> out.append('\f');
          case 'u' -> {
            if (pos + 4 > text.length()) {
              throw error("short \\u escape");
            }
            try {
              out.append((char) Integer.parseInt(text.substring(pos, pos + 4), 16));
            } catch (NumberFormatException ex) {
              throw error("bad \\u escape");
            }
            pos += 4;
          }
          default -> throw error("bad escape \\" + e);
        }
      }
    }

    private Object number() {
      int start = pos;
      if (peek() == '-') {
        pos++;
      }
      boolean integral = true;
      while (pos < text.length()) {
        char c = text.charAt(pos);
        if (c >= '0' && c <= '9') {
          pos++;
        } else if (c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-') {
          integral = false;
          pos++;
        } else {
          break;
        }
      }
      String digits = text.substring(start, pos);
      try {
        if (integral) {
          BigInteger big = new BigInteger(digits);
          return big.bitLength() < 64 ? (Object) big.longValue() : (Object) big.doubleValue();
        }
        return Double.parseDouble(digits);
      } catch (NumberFormatException e) {
        throw error("bad number " + digits);
      }
    }

    private char peek() {
      if (pos >= text.length()) {
        throw error("unexpected end");
      }
      return text.charAt(pos);
    }

    private char next() {
      char c = peek();
      pos++;
      return c;
    }

    private void expect(char c) {
      if (next() != c) {
        pos--;
        throw error("expected '" + c + "'");
      }
    }
  }
}
