package dev.jobbroker.client;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

/** The JSON codec of step results: what other languages write reads back the same. */
class JsonTest {
  @Test
  void decodesEveryJsonTypeToItsJavaType() {
    Object v =
        Json.parse(
            " {\"n\": 1, \"big\": 12345678901234, \"half\": 1.5, \"exp\": 1e3, \"neg\": -2,"
                + " \"t\": true, \"f\": false, \"none\": null, \"list\": [1, \"x\", [], {}],"
                + " \"text\": \"h\\u00e9llo \\u2713 \\\"q\\\" \\\\ \\n\"} ");
    Map<String, Object> expected = new LinkedHashMap<>();
    expected.put("n", 1L);
    expected.put("big", 12345678901234L);
    expected.put("half", 1.5);
    expected.put("exp", 1000.0);
    expected.put("neg", -2L);
    expected.put("t", true);
    expected.put("f", false);
    expected.put("none", null);
    expected.put("list", Arrays.asList(1L, "x", List.of(), Map.of()));
    expected.put("text", "h\u00e9llo \u2713 \"q\" \\ \n");
    assertEquals(expected, v);
  }

  @Test
  void encodesCompactlyAndReadsBackTheSameValue() {
    Map<String, Object> value = new LinkedHashMap<>();
    value.put("by", "java");
    value.put("n", 3);
    value.put("half", 3.5);
    value.put("whole", 2.0);
    value.put("list", Arrays.asList(1, "x", true, null));
    value.put("text", "h\u00e9llo \u2713\t\u0001");
    byte[] json = Json.encode(value);
    assertArrayEquals(
        ("{\"by\":\"java\",\"n\":3,\"half\":3.5,\"whole\":2.0,\"list\":[1,\"x\",true,null],"
                + "\"text\":\"h\u00e9llo \u2713\\t\\u0001\"}")
            .getBytes(StandardCharsets.UTF_8),
        json);
    Map<String, Object> back = new LinkedHashMap<>(value);
    back.put("n", 3L); // integers decode as Long
    back.put("list", Arrays.asList(1L, "x", true, null));
    assertEquals(back, Json.decode(json));
  }

  @Test
  void refusesWhatIsNotJson() {
    for (String bad : List.of("", "{", "[1,]", "{\"a\" 1}", "tru", "1 2", "\"open", "01x")) {
      assertThrows(IllegalArgumentException.class, () -> Json.parse(bad), bad);
    }
    assertThrows(IllegalArgumentException.class, () -> Json.encode(Double.NaN));
    assertThrows(IllegalArgumentException.class, () -> Json.encode(new Object()));
  }
}
