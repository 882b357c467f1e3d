// An idempotent Java producer exactly as a Kafka distribution's kafka-clients ships it, for the
// real-Kafka tier (tests/realkafka/clients.py: produce_java).
//
// Usage: ThrottledProducer <bootstrap> <topic> [key=value ...]
// Settings are the client's defaults plus enable.idempotence=true and the key=value pairs.
// It fetches the topic's metadata, prints READY, then reads "key<TAB>value" lines from stdin
// until EOF and sends each. It prints one line per record as the callback reports it:
//   ACK <index> <partition> <offset> <epoch-ms>      or      FAIL <index> <exception>: <message>
// and DONE after close(). The exit code is 0 unless the program itself failed.
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Properties;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.StringSerializer;

public class ThrottledProducer {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        String topic = args[1];
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        for (int i = 2; i < args.length; i++) {
            int eq = args[i].indexOf('=');
            props.put(args[i].substring(0, eq), args[i].substring(eq + 1));
        }
        BufferedReader in =
                new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(props)) {
            producer.partitionsFor(topic);
            System.out.println("READY");
            System.out.flush();
            String line;
            int index = 0;
            while ((line = in.readLine()) != null) {
                int tab = line.indexOf('\t');
                final int n = index++;
                ProducerRecord<String, String> record =
                        new ProducerRecord<>(topic, line.substring(0, tab), line.substring(tab + 1));
                try {
                    producer.send(record, (metadata, error) -> {
                        if (error == null) {
                            System.out.println("ACK " + n + " " + metadata.partition() + " "
                                    + metadata.offset() + " " + System.currentTimeMillis());
                        } else {
                            System.out.println("FAIL " + n + " " + error.getClass().getName()
                                    + ": " + error.getMessage());
                        }
                    });
                } catch (Exception error) {
                    System.out.println("FAIL " + n + " " + error.getClass().getName() + ": "
                            + error.getMessage());
                }
            }
            producer.flush();
        }
        System.out.println("DONE");
        System.out.flush();
    }
}
